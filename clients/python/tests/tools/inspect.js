// Returns what its handler received, so the Python client's tests can check defaults and keys.
export default {
  name: "inspect",
  description: "Returns the arguments it received. Used by the Python client's tests.",
  parameters: {
    type: "object",
    required: ["query"],
    properties: {
      query: { type: "string", description: "What to look for" },
      limit: { type: "integer", default: 10, maximum: 100 },
      options: {
        type: "object",
        default: {},
        properties: { lang: { type: "string", default: "en" } },
      },
    },
  },
  handler(args, ctx) {
    return { args, context: ctx.context, idempotencyKey: ctx.idempotencyKey, callId: ctx.callId };
  },
};
