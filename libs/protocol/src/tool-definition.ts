import { z } from "zod";
import { Defaults } from "./defaults.js";
import { ErrorCode } from "./errors.js";
import { MAX_TOOL_NAME_LENGTH } from "./envelopes.js";

const ERROR_CODES = Object.values(ErrorCode) as [ErrorCode, ...ErrorCode[]];

/** Temporal-style retry policy of a tool. */
export const RetryPolicySchema = z.object({
  max_attempts: z.number().int().min(1).default(3).describe("Attempts in all, the first included."),
  initial_backoff_ms: z.number().int().nonnegative().default(1_000),
  backoff_multiplier: z.number().min(1).default(2),
  max_backoff_ms: z.number().int().nonnegative().default(30_000),
  non_retryable_codes: z.array(z.enum(ERROR_CODES)).default([]),
});

/** Temporal-style retry policy of a tool. */
export type RetryPolicy = z.infer<typeof RetryPolicySchema>;

/**
 * What a tool acts with downstream: `service` (the tool's own configured credential, the same
 * for every caller), `user-secret` (a secret the calling user registered for the tool with
 * `toolmesh secrets set`), or `token-exchange` (an RFC 8693 token for `audience` issued for the
 * calling user). Never holds a secret itself.
 */
export const ToolCredentialsSchema = z
  .discriminatedUnion("type", [
    z.strictObject({ type: z.literal("service") }),
    z.strictObject({ type: z.literal("user-secret") }),
    z.strictObject({
      type: z.literal("token-exchange"),
      audience: z.string().min(1).describe("The downstream API the token is for."),
      scopes: z.array(z.string().min(1)).default([]),
    }),
  ])
  .meta({ id: "ToolCredentials", description: "What a tool acts with downstream." });

/** What a tool acts with downstream. */
export type ToolCredentials = z.infer<typeof ToolCredentialsSchema>;

/** What kind of worker serves a tool. */
export const ToolKindSchema = z.enum(["builtin", "native", "mcp"]);

/** What kind of worker serves a tool. */
export type ToolKind = z.infer<typeof ToolKindSchema>;

/**
 * A registry entry: everything the mesh knows about a tool. `parameters` is the schema a
 * model may see — preset params are already removed; only their names are listed.
 */
export const ToolDefinitionSchema = z
  .object({
    name: z.string().min(1).max(MAX_TOOL_NAME_LENGTH),
    description: z.string().default(""),
    summary: z.string().describe("One line for the compact catalog."),
    parameters: z
      .record(z.string(), z.unknown())
      .describe("JSON Schema (2020-12) of the arguments, an object schema."),
    groups: z.array(z.string().min(1)).default(["default"]),
    system_params: z.array(z.string()).default([...Defaults.systemParams]),
    preset_params: z
      .array(z.string())
      .default([])
      .describe("Names injected by the executor; values never leave it."),
    kind: ToolKindSchema,
    progress: z
      .boolean()
      .default(false)
      .describe(
        "Whether the tool emits progress events on `progress.{call}` while it runs; a tool " +
          "registered with `false` never does.",
      ),
    owner: z
      .string()
      .min(1)
      .describe("Identity of the registering service; its replicas share it."),
    owner_account: z
      .boolean()
      .optional()
      .describe(
        "Set by the mesh alone, for a tool registered from tool owner `owner`'s NATS account: " +
          "its work waits on that owner's work stream (ADR 0041).",
      ),
    timeout_ms: z
      .number()
      .int()
      .positive()
      .default(Defaults.toolTimeoutMs)
      .describe("Per attempt."),
    retry: RetryPolicySchema.prefault({}),
    annotations: z.record(z.string(), z.unknown()).optional(),
    origin: z.record(z.string(), z.unknown()).optional(),
    credentials: ToolCredentialsSchema.optional().describe(
      "What the tool acts with downstream; absent: nothing the mesh provides.",
    ),
  })
  .meta({ id: "ToolDefinition", description: "A tool as stored in the registry." });

/** A registry entry. */
export type ToolDefinition = z.infer<typeof ToolDefinitionSchema>;

/**
 * The tool owner whose work stream holds a tool's work: `owner` of a tool registered from an
 * owner's account (`owner_account`), undefined for a tool served in the mesh account.
 */
export function workOwnerOf(definition: Pick<ToolDefinition, "owner" | "owner_account">) {
  return definition.owner_account === true ? definition.owner : undefined;
}

/** A registry entry as a registering service writes it (defaults not yet applied). */
export type ToolDefinitionInput = z.input<typeof ToolDefinitionSchema>;

/**
 * The parameter schema a model may see: `def.parameters` with the system parameters — and,
 * defensively, any preset name — removed from `properties` and `required`. Used wherever a
 * schema leaves the mesh for a model (catalogs, schema events, `missing_arguments`). The
 * definition is not changed; it is returned as it is when nothing needs hiding.
 */
export function modelParameters(def: ToolDefinition): Record<string, unknown> {
  const hidden = new Set([...def.system_params, ...def.preset_params]);
  const { properties, required } = def.parameters;
  const shownProperties =
    isRecord(properties) && Object.keys(properties).some((name) => hidden.has(name))
      ? Object.fromEntries(Object.entries(properties).filter(([name]) => !hidden.has(name)))
      : properties;
  const requiredList = Array.isArray(required) ? (required as unknown[]) : undefined;
  const shownRequired = requiredList?.filter(
    (name) => typeof name !== "string" || !hidden.has(name),
  );
  if (shownProperties === properties && shownRequired?.length === requiredList?.length)
    return def.parameters;
  const parameters: Record<string, unknown> = { ...def.parameters };
  if (shownProperties !== undefined) parameters.properties = shownProperties;
  if (shownRequired !== undefined) parameters.required = shownRequired;
  return parameters;
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** First sentence of a description, bounded to `maxLength` characters (default 120). */
export function summarize(description: string, maxLength = 120): string {
  const firstLine = description.trim().split(/\r?\n/, 1)[0] ?? "";
  const sentence = /^(.+?[.!?])(\s|$)/.exec(firstLine)?.[1] ?? firstLine;
  if (sentence.length <= maxLength) return sentence;
  let cut = sentence.slice(0, maxLength - 1);
  // Never end inside a surrogate pair.
  if (/[\uD800-\uDBFF]$/.test(cut)) cut = cut.slice(0, -1);
  return `${cut.trimEnd()}…`;
}
