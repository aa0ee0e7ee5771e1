// A plain-object tool: no import, so it runs from any mounted folder (a ConfigMap, a volume).
export default {
  name: "shout",
  description: "Returns the text in capitals, with an exclamation mark.",
  parameters: {
    type: "object",
    properties: { text: { type: "string", description: "What to shout" } },
    required: ["text"],
    additionalProperties: false,
  },
  handler: ({ text }) => `${text.toUpperCase()}!`,
};
