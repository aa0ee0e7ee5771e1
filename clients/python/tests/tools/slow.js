// Reports progress, then sleeps for `ms` unless aborted.
export default {
  name: "slow",
  progress: true,
  description: "Emits progress, then sleeps for ms milliseconds.",
  parameters: {
    type: "object",
    required: ["ms"],
    properties: { ms: { type: "integer", minimum: 0 }, steps: { type: "integer", default: 2 } },
  },
  async handler({ ms, steps }, ctx) {
    for (let i = 0; i < steps; i++) ctx.emit({ step: i });
    await new Promise((resolve, reject) => {
      const timer = setTimeout(resolve, ms);
      ctx.signal.addEventListener("abort", () => {
        clearTimeout(timer);
        reject(ctx.signal.reason);
      });
    });
    return { slept: ms };
  },
};
