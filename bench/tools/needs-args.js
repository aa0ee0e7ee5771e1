// A tool with required parameters, called without them to measure schema expansion.
export default {
  name: "needs_args",
  description: "Needs a city and a unit; called without them it sends its schema.",
  parameters: {
    type: "object",
    properties: {
      city: { type: "string", description: "City name" },
      unit: { type: "string", enum: ["c", "f"], description: "Temperature unit" },
    },
    required: ["city", "unit"],
    additionalProperties: false,
  },
  handler: ({ city, unit }) => `${city} ${unit}`,
};
