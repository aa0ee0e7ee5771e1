// Works for a fixed time (default 100 ms): a tool whose executors can serve a known number of
// calls per second, for the fair-share scenario.
export default {
  name: "work",
  description: "Works for `ms` milliseconds, then returns.",
  parameters: {
    type: "object",
    properties: { ms: { type: "integer", minimum: 0, maximum: 10000, default: 100 } },
    additionalProperties: false,
  },
  handler: ({ ms }, ctx) =>
    new Promise((resolve) => {
      const timer = setTimeout(() => resolve("done"), ms);
      ctx.signal.addEventListener("abort", () => {
        clearTimeout(timer);
        resolve("aborted");
      });
    }),
};
