import { defineTool } from "@toolmesh/executor";
import { z } from "zod";

// A typed tool: the zod input generates the JSON Schema models see and types the handler.
// `api_key` is a preset: hidden from models, injected here, never sent on the wire.
export default defineTool({
  name: "get_weather",
  description:
    "Forecast for a city over the next days. Answers in the units of the caller's context.",
  groups: ["web"],
  input: z.object({
    city: z.string().min(1).describe("City name"),
    days: z.number().int().min(1).max(7).default(3).describe("How many days"),
    api_key: z.string(),
  }),
  presets: { api_key: "demo-key-not-a-secret" },
  handler({ city, days, api_key }, ctx) {
    const units = ctx.context.units === "imperial" ? "F" : "C";
    return {
      city,
      units,
      authenticated: api_key.length > 0,
      days: Array.from({ length: days }, (_, i) => ({ day: i + 1, high: 20 + i, unit: units })),
    };
  },
});
