// A builtin tool needs no import: a plain object with a handler is enough.
export default {
  name: "echo",
  description: "Returns the text it is given. Useful to check that the mesh answers.",
  parameters: {
    type: "object",
    properties: {
      text: { type: "string", description: "What to send back" },
      upper: { type: "boolean", description: "Upper-case the text", default: false },
    },
    required: ["text"],
    additionalProperties: false,
  },
  handler: ({ text, upper }) => (upper ? text.toUpperCase() : text),
};
