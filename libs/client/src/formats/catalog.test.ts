import { describe, expect, it } from "vitest";
import { ToolDefinitionSchema } from "@toolmesh/protocol";
import type { ToolDefinition } from "@toolmesh/protocol";
import {
  COMPACT_SCHEMA_NOTE,
  compactEntry,
  compactParameters,
  declaredParameters,
  describeEntry,
  expandedEntry,
  isExpanded,
} from "./catalog.js";

const PARAMETERS = {
  type: "object",
  properties: { path: { type: "string" } },
  required: ["path"],
};

function definition(extra: Partial<ToolDefinition> = {}): ToolDefinition {
  return ToolDefinitionSchema.parse({
    name: "fs.read_file",
    description: "Read a file from the workspace.\nReturns its text.",
    summary: "Read a file.",
    kind: "builtin",
    owner: "test",
    parameters: PARAMETERS,
    preset_params: ["api_key"],
    ...extra,
  });
}

describe("catalog entries", () => {
  it("makes a compact entry: name and one line, no parameters", () => {
    const entry = compactEntry(definition());
    expect(entry).toEqual({ name: "fs.read_file", summary: "Read a file." });
    expect(isExpanded(entry)).toBe(false);
  });

  it("derives the one line from the description when the summary is blank", () => {
    expect(compactEntry(definition({ summary: "  " })).summary).toBe(
      "Read a file from the workspace.",
    );
    expect(compactEntry(definition({ summary: "Two\n  lines." })).summary).toBe("Two lines.");
  });

  it("makes an expanded entry with the full schema and description", () => {
    const entry = expandedEntry(definition());
    expect(entry).toEqual({
      name: "fs.read_file",
      summary: "Read a file.",
      description: "Read a file from the workspace.\nReturns its text.",
      parameters: PARAMETERS,
    });
    expect(isExpanded(entry)).toBe(true);
    expect(expandedEntry(definition({ description: "" }))).not.toHaveProperty("description");
  });

  it("shows a model no system parameter in an expanded entry", () => {
    const entry = expandedEntry(
      definition({
        parameters: {
          type: "object",
          properties: { path: { type: "string" }, storage: { type: "object" }, executor: {} },
          required: ["path", "storage"],
        },
      }),
    );
    expect(entry.parameters).toEqual(PARAMETERS);
  });

  it("declares a compact entry as a valid function that announces its schema", () => {
    const entry = compactEntry(definition());
    expect(declaredParameters(entry)).toEqual({
      type: "object",
      properties: {},
      additionalProperties: true,
    });
    expect(describeEntry(entry)).toBe(`Read a file. (${COMPACT_SCHEMA_NOTE})`);
    expect(COMPACT_SCHEMA_NOTE).toMatch(/full parameter schema arrives after a first call/);
    // A fresh placeholder each time, so callers cannot corrupt each other's declarations.
    expect(compactParameters()).not.toBe(compactParameters());
  });

  it("declares an expanded entry with its own schema and description", () => {
    const entry = expandedEntry(definition());
    expect(declaredParameters(entry)).toBe(entry.parameters);
    expect(describeEntry(entry)).toBe("Read a file from the workspace.\nReturns its text.");
    expect(describeEntry({ name: "x", summary: "Only a summary.", parameters: {} })).toBe(
      "Only a summary.",
    );
  });
});
