import { jsonForFence, markdownCode } from "./fallback.js";

/** One tool whose full schema the model needs on the next turn (docs/protocol.md#schema-expansion-catalog-and-tool-groups). */
export interface SupplementedSchema {
  /** The tool's name as the model calls it. */
  tool: string;
  /** The tool's full parameter schema (JSON Schema, an object schema). */
  parameters: Record<string, unknown>;
  /** Required parameters the model's last call left out. */
  missing?: string[];
  /** The tool's description. */
  description?: string;
}

/** Heading of the supplemented-schemas section. */
export const SUPPLEMENTED_SCHEMAS_HEADING = "## Supplemented tool schemas";

/**
 * Renders the "supplemented schemas" section for the next turn's system prompt: for
 * each tool its description, the parameters that were missing, a list of its top-level
 * parameters marked required/missing, and the full schema as JSON; then asks the model to
 * call again with every required parameter. Entries naming the same tool are merged (first
 * schema and description, missing lists united). Empty input → `""`.
 */
export function renderSupplementedSchemas(schemas: readonly SupplementedSchema[]): string {
  if (schemas.length === 0) return "";
  const merged = new Map<string, SupplementedSchema & { missing: string[] }>();
  for (const schema of schemas) {
    const known = merged.get(schema.tool);
    if (known === undefined) {
      merged.set(schema.tool, { ...schema, missing: [...new Set(schema.missing ?? [])] });
    } else {
      known.missing = [...new Set([...known.missing, ...(schema.missing ?? [])])];
      known.description ??= schema.description;
    }
  }

  const lines: string[] = [
    SUPPLEMENTED_SCHEMAS_HEADING,
    "",
    "Your last call to the tools below was incomplete, so here is each one's full parameter " +
      "schema. Call the tool again with all required parameters filled in.",
  ];
  for (const entry of merged.values()) {
    lines.push("", `### ${markdownCode(entry.tool)}`, "");
    const description = entry.description?.trim();
    if (description !== undefined && description !== "") lines.push(description, "");
    if (entry.missing.length > 0) {
      lines.push(`Missing in your last call: ${entry.missing.map(markdownCode).join(", ")}.`, "");
    }
    const parameterLines = describeParameters(entry.parameters, new Set(entry.missing));
    if (parameterLines.length > 0) lines.push("Parameters:", ...parameterLines, "");
    lines.push("Full schema:", "```json", jsonForFence(entry.parameters), "```");
  }
  lines.push(
    "",
    "Call each tool again with every required parameter; do not leave out the missing ones.",
  );
  return lines.join("\n");
}

function describeParameters(schema: Record<string, unknown>, missing: Set<string>): string[] {
  const properties = isRecord(schema.properties) ? schema.properties : {};
  const required = new Set(
    Array.isArray(schema.required)
      ? schema.required.filter((name): name is string => typeof name === "string")
      : [],
  );
  const lines: string[] = [];
  for (const [name, property] of Object.entries(properties)) {
    const marks = [typeLabel(property), required.has(name) ? "**required**" : "optional"];
    if (missing.has(name)) marks.push("**missing**");
    if (isRecord(property) && "default" in property) {
      marks.push(`default ${JSON.stringify(property.default)}`);
    }
    const description =
      isRecord(property) && typeof property.description === "string"
        ? ` — ${property.description.replace(/\s+/g, " ").trim()}`
        : "";
    lines.push(`- ${markdownCode(name)} (${marks.join(", ")})${description}`);
  }
  // Missing names the schema does not list as properties still have to be shown.
  for (const name of missing) {
    if (!Object.hasOwn(properties, name)) {
      lines.push(`- ${markdownCode(name)} (**required**, **missing**)`);
    }
  }
  return lines;
}

function typeLabel(property: unknown): string {
  if (!isRecord(property)) return "any";
  if (Array.isArray(property.enum)) {
    return `one of ${property.enum.map((value) => JSON.stringify(value)).join(", ")}`;
  }
  if (typeof property.type === "string") return property.type;
  if (Array.isArray(property.type)) return property.type.join(" | ");
  if (typeof property.$ref === "string") return "see schema";
  if (Array.isArray(property.anyOf) || Array.isArray(property.oneOf)) return "see schema";
  return "any";
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}
