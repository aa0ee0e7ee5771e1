import { describe, expect, it } from "vitest";
import { ErrorCode } from "@toolmesh/protocol";
import type { CatalogEntry } from "./catalog.js";
import { COMPACT_SCHEMA_NOTE } from "./catalog.js";
import { formatCatalogFor } from "./format-for.js";
import { SUPPLEMENTED_SCHEMAS_HEADING } from "./supplemented.js";

const ENTRIES: CatalogEntry[] = [
  { name: "get_weather", summary: "Forecast for a city." },
  { name: "fs.read", summary: "Reads a file." },
];
const WEATHER = {
  type: "object",
  properties: { city: { type: "string" } },
  required: ["city"],
};

describe("formatCatalogFor", () => {
  it("declares compact entries natively for a model with function calling", () => {
    const formatted = formatCatalogFor(
      { provider: "openai", supportsFunctionCalling: true },
      ENTRIES,
    );
    if (formatted.strategy !== "native" || formatted.provider !== "openai")
      throw new Error("native");
    expect(formatted.tools.map((t) => t.function.name)).toEqual(["get_weather", "fs_read"]);
    expect(formatted.tools[0]?.function.description).toContain(COMPACT_SCHEMA_NOTE);
    expect(formatted.nameMap.toTool.get("fs_read")).toBe("fs.read");
    expect(formatted.supplement).toBe("");
  });

  it("uses each provider's shape", () => {
    const anthropic = formatCatalogFor(
      { provider: "anthropic", supportsFunctionCalling: true },
      ENTRIES,
    );
    expect(anthropic).toMatchObject({ strategy: "native", provider: "anthropic" });
    const gemini = formatCatalogFor({ provider: "gemini", supportsFunctionCalling: true }, ENTRIES);
    expect(gemini).toMatchObject({ strategy: "native", provider: "gemini" });
  });

  it("falls back to the structured-output prompt for a model without function calling", () => {
    const formatted = formatCatalogFor(
      { provider: "openai", supportsFunctionCalling: false },
      ENTRIES,
    );
    expect(formatted.strategy).toBe("structured");
    if (formatted.strategy === "structured") expect(formatted.prompt).toContain("`get_weather`");
  });

  it("follows the agent's output strategy, and refuses native-only without support", () => {
    const forced = formatCatalogFor(
      {
        provider: "openai",
        supportsFunctionCalling: true,
        outputStrategy: { function_calling: false, fallback_to_structured_output: true },
      },
      ENTRIES,
    );
    expect(forced.strategy).toBe("structured");
    expect(() =>
      formatCatalogFor(
        {
          provider: "openai",
          supportsFunctionCalling: false,
          outputStrategy: { function_calling: true, fallback_to_structured_output: false },
        },
        ENTRIES,
      ),
    ).toThrow(expect.objectContaining({ code: ErrorCode.InvalidRequest }));
  });

  it("declares supplemented tools with their full schema and returns the prompt section", () => {
    const supplemented = [{ tool: "get_weather", parameters: WEATHER, missing: ["city"] }];
    const native = formatCatalogFor(
      { provider: "openai", supportsFunctionCalling: true },
      ENTRIES,
      {
        supplemented,
      },
    );
    if (native.strategy !== "native" || native.provider !== "openai") throw new Error("native");
    expect(native.tools[0]?.function.parameters).toEqual(WEATHER);
    expect(native.tools[1]?.function.parameters).toMatchObject({ properties: {} });
    expect(native.supplement.startsWith(SUPPLEMENTED_SCHEMAS_HEADING)).toBe(true);
    const structured = formatCatalogFor(
      { provider: "openai", supportsFunctionCalling: false },
      ENTRIES,
      {
        supplemented,
      },
    );
    if (structured.strategy !== "structured") throw new Error("structured");
    expect(structured.prompt).toContain('"city"');
    expect(structured.supplement).toContain("Missing in your last call: `city`.");
  });
});
