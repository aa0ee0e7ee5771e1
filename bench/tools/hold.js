// Holds a call until a given time (or its abort signal): the benchmark keeps thousands of calls
// in flight with it to measure memory per call.
export default {
  name: "hold",
  description: "Waits until the given epoch time in ms, then returns.",
  parameters: {
    type: "object",
    properties: { until: { type: "number", description: "Epoch ms to return at" } },
    required: ["until"],
    additionalProperties: false,
  },
  handler: ({ until }, ctx) =>
    new Promise((resolve) => {
      const timer = setTimeout(() => resolve("released"), Math.max(0, until - Date.now()));
      ctx.signal.addEventListener("abort", () => {
        clearTimeout(timer);
        resolve("aborted");
      });
    }),
};
