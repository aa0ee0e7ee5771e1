import type { ToolDefinition } from "@toolmesh/protocol";
import { modelParameters, summarize } from "@toolmesh/protocol";

/**
 * One tool as a frontend shows it to a model. A compact entry (docs/protocol.md#schema-expansion-catalog-and-tool-groups) has a name and a
 * one-line summary and no `parameters`; an expanded entry carries the tool's full JSON Schema.
 */
export interface CatalogEntry {
  /** The tool's registry name, e.g. `fs.read_file`; providers may need it mapped (`NameMap`). */
  name: string;
  /** One line for the compact catalog. */
  summary: string;
  /** The full description; expanded entries only. */
  description?: string;
  /** The full parameter schema (JSON Schema, an object schema); expanded entries only. */
  parameters?: Record<string, unknown>;
}

/**
 * Sentence appended to a compact entry's description when it is given to a model as a
 * function, so the model knows why the parameter list is empty and what happens next.
 */
export const COMPACT_SCHEMA_NOTE =
  "Only a summary is shown: the full parameter schema arrives after a first call. " +
  "Call it with the arguments you can infer; if required ones are missing you will get the schema.";

/**
 * Returns the placeholder schema of a compact entry: an object accepting anything, so the
 * declaration is valid for function calling. A fresh object each call; callers may mutate it.
 */
export function compactParameters(): Record<string, unknown> {
  return { type: "object", properties: {}, additionalProperties: true };
}

/** The compact form of a registry entry: name and one line (the summary, else derived). */
export function compactEntry(def: ToolDefinition): CatalogEntry {
  return { name: def.name, summary: oneLine(def) };
}

/**
 * The expanded form of a registry entry: name, summary, description (when non-empty) and the
 * parameter schema a model may see (system and preset parameters hidden, `modelParameters`).
 */
export function expandedEntry(def: ToolDefinition): CatalogEntry {
  const entry: CatalogEntry = {
    name: def.name,
    summary: oneLine(def),
    parameters: modelParameters(def),
  };
  if (def.description.trim() !== "") entry.description = def.description;
  return entry;
}

/** Whether the entry carries its full parameter schema. */
export function isExpanded(entry: CatalogEntry): boolean {
  return entry.parameters !== undefined;
}

/**
 * The description to declare for the entry: expanded → its description (else its summary);
 * compact → its summary followed by {@link COMPACT_SCHEMA_NOTE}.
 */
export function describeEntry(entry: CatalogEntry): string {
  if (isExpanded(entry)) return entry.description ?? entry.summary;
  return entry.summary === "" ? COMPACT_SCHEMA_NOTE : `${entry.summary} (${COMPACT_SCHEMA_NOTE})`;
}

/** The parameters to declare for the entry: its schema, or {@link compactParameters}. */
export function declaredParameters(entry: CatalogEntry): Record<string, unknown> {
  return entry.parameters ?? compactParameters();
}

function oneLine(def: ToolDefinition): string {
  const summary = def.summary.trim() === "" ? summarize(def.description) : def.summary;
  return summary.replace(/\s+/g, " ").trim();
}
