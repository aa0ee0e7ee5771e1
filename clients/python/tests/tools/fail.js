// Fails for good: a non-retryable tool error.
export default {
  name: "fail",
  description: "Always fails.",
  groups: ["risky"],
  parameters: { type: "object", properties: { why: { type: "string", default: "on purpose" } } },
  handler({ why }) {
    throw Object.assign(new Error(`failed ${why}`), { code: "tool_error", retryable: false });
  },
};
