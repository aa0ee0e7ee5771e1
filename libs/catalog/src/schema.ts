import type { CatalogEntry, ToolDefinition, ToolSchema } from "@toolmesh/protocol";
import { modelParameters, summarize } from "@toolmesh/protocol";

/** Longest one-line summary in a compact catalog, in characters. */
export const MAX_SUMMARY_LENGTH = 120;

/** A registry entry with the revision it was read at (a `CompiledTool` fits). */
export interface RevisedTool {
  readonly definition: ToolDefinition;
  readonly revision: number;
}

/**
 * The one line a compact catalog shows for a tool: its configured `summary`, else the first
 * sentence of its description; whitespace collapsed, at most {@link MAX_SUMMARY_LENGTH}
 * characters (cut with `…`).
 */
export function compactLine(def: ToolDefinition, maxLength = MAX_SUMMARY_LENGTH): string {
  // A configured summary is meant as the line itself: joined, not cut at its first newline.
  const configured = def.summary.replace(/\s+/g, " ").trim();
  const line =
    configured === "" ? summarize(def.description, maxLength) : summarize(configured, maxLength);
  return line.replace(/\s+/g, " ").trim();
}

/**
 * The full schema a model may see: the definition's parameters (preset parameters are already
 * absent from them) with the system parameters — and, defensively, any preset name — removed
 * from `properties` and `required`. The definition is not changed.
 */
export function modelSchema(tool: RevisedTool): ToolSchema {
  const def = tool.definition;
  const parameters = modelParameters(def);
  const required = Array.isArray(parameters.required)
    ? parameters.required.filter((name): name is string => typeof name === "string")
    : [];
  return {
    tool: def.name,
    revision: tool.revision,
    summary: compactLine(def),
    description: def.description,
    parameters,
    required,
    groups: [...def.groups],
    progress: def.progress,
  };
}

/** The compact catalog entry of a tool: name, one line, groups, revision; no schema. */
export function compactCatalogEntry(tool: RevisedTool): CatalogEntry {
  const def = tool.definition;
  return {
    name: def.name,
    summary: compactLine(def),
    groups: [...def.groups],
    revision: tool.revision,
    progress: def.progress,
  };
}

/** The expanded catalog entry of a tool: the compact one plus description and full schema. */
export function expandedCatalogEntry(tool: RevisedTool): CatalogEntry {
  const schema = modelSchema(tool);
  const entry = compactCatalogEntry(tool);
  if (schema.description.trim() !== "") entry.description = schema.description;
  entry.parameters = schema.parameters;
  return entry;
}
