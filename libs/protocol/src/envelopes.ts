import { z } from "zod";
import { WireErrorSchema } from "./errors.js";
import { CallerIdentitySchema } from "./identity.js";

/** Longest tool name accepted, in characters. */
export const MAX_TOOL_NAME_LENGTH = 128;

/** Longest call id, session id, tenant id or idempotency key, in characters. */
export const MAX_ID_LENGTH = 256;

const Id = z.string().min(1).max(MAX_ID_LENGTH);
const JsonObject = z.record(z.string(), z.unknown());

/** One OpenAI `tool_calls` entry. `function.arguments` may be a JSON string or an object. */
export const ToolCallSchema = z
  .object({
    id: Id.describe("The model's tool call id; answered as `tool_call_id`."),
    type: z.literal("function").default("function"),
    function: z.object({
      name: z.string().min(1).max(4096).describe("Tool name as the model wrote it."),
      arguments: z
        .union([z.string(), JsonObject])
        .describe("JSON text of an object (OpenAI style) or the object itself."),
    }),
  })
  .meta({ id: "ToolCall", description: "One entry of an OpenAI `tool_calls` array." });

/** One OpenAI `tool_calls` entry. */
export type ToolCall = z.infer<typeof ToolCallSchema>;

/** A call a frontend submits on `{p}.v1.calls.{tenant}.{session}`. */
export const CallRequestSchema = z
  .object({
    tool_call: ToolCallSchema,
    session_id: Id.describe("The caller's session; must map to the session token of the subject."),
    idempotency_key: Id.optional().describe(
      "Deduplicates submissions; defaults to `{session_id}/{tool_call.id}`.",
    ),
    context: JsonObject.optional().describe(
      "Call-level execution context; wins over agent_context.",
    ),
    agent_context: JsonObject.optional().describe(
      "Agent-level execution context; wins over the executor's toolkit context.",
    ),
    agent: Id.optional().describe("The agent this call is made for."),
    identity: CallerIdentitySchema.optional().describe(
      "Who the call acts for; its tenant must be the tenant the call is submitted in.",
    ),
    timeout_ms: z
      .number()
      .int()
      .positive()
      .optional()
      .describe(
        "Budget for the whole call from its acceptance by the server, in ms; the deadline.",
      ),
    attempt_timeout_ms: z
      .number()
      .int()
      .positive()
      .optional()
      .describe("Lowers the tool's per-attempt timeout for this call, in ms; never raises it."),
    edge_params: z
      .array(z.string())
      .optional()
      .describe("Params connected by a workflow edge: their value comes from elsewhere."),
  })
  .meta({ id: "CallRequest", description: "A tool call submitted by a frontend." });

/** A call a frontend submits. */
export type CallRequest = z.infer<typeof CallRequestSchema>;

/**
 * The idempotency key of a call or cancel request: its own `idempotency_key`, else
 * `{session_id}/{tool call id}` (see `docs/protocol.md`, "Idempotency").
 */
export function idempotencyKeyOf(
  request: { idempotency_key?: string | undefined; session_id: string },
  callId: string,
): string {
  return request.idempotency_key ?? `${request.session_id}/${callId}`;
}

/** Value types of `input_parameters`, in the vocabulary of `input_parameters` (docs/protocol.md#resolvedcall). */
export const ParamTypeSchema = z.enum(["str", "int", "float", "bool", "list", "dict"]);

/** Value types of `input_parameters`. */
export type ParamType = z.infer<typeof ParamTypeSchema>;

/** Where a parameter's value came from, highest priority first. */
export const ParamSourceSchema = z.enum(["edge", "tool_args", "default", "zero_value"]);

/** Where a parameter's value came from. */
export type ParamSource = z.infer<typeof ParamSourceSchema>;

/** One entry of `input_parameters`: one per schema param, system and preset params excluded. */
export const InputParameterSchema = z.object({
  name: z.string(),
  type: ParamTypeSchema,
  value: z.unknown(),
  source: ParamSourceSchema,
});

/** One entry of `input_parameters`. */
export type InputParameter = z.infer<typeof InputParameterSchema>;

/** Session address as subject tokens (see `docs/protocol.md`, "Tokens"). */
export const SessionAddressSchema = z.object({ tenant: z.string(), session: z.string() });

/**
 * What the policy sets decided for a call that went on (docs/policy.md): kept with its record
 * and its work, so the decision and any approval stay with the call.
 */
export const CallDecisionSchema = z
  .object({
    effect: z
      .enum(["allow", "approval"])
      .describe("`allow`: permitted; `approval`: permitted once a person decided."),
    policies: z.array(z.string()).describe("Ids of the policies that decided it."),
    policy_version: z.string().describe("Versions of the policy sets it was decided with."),
    approval: z
      .object({
        mode: z.enum(["operator", "caller"]),
        effect: z.enum(["approve", "deny", "expire"]),
        by: z.string(),
        reason: z.string().optional(),
        requested_at: z.number(),
        at: z.number().describe("When it was decided, epoch ms by the NATS server's clock."),
      })
      .optional(),
  })
  .meta({ id: "CallDecision", description: "The policy decision a call went on with." });

/** The policy decision a call went on with. */
export type CallDecision = z.infer<typeof CallDecisionSchema>;

/** The resolver's output: what executors receive on `{p}.v1.work.{tool}`. */
export const ResolvedCallSchema = z
  .object({
    call_id: Id.describe("Equals tool_call_id."),
    tool_call_id: Id,
    // The default key `{session_id}/{tool_call.id}` joins two ids.
    idempotency_key: z
      .string()
      .min(1)
      .max(2 * MAX_ID_LENGTH + 1),
    session_id: Id,
    address: SessionAddressSchema.describe("Tenant and session tokens where answers go."),
    tool: z.string(),
    arguments: JsonObject.describe("The model's arguments with schema defaults filled."),
    missing_required: z.array(z.string()),
    missing_optional: z.array(z.string()),
    input_parameters: z.array(InputParameterSchema),
    context: JsonObject,
    agent_context: JsonObject,
    agent: Id.optional(),
    identity: CallerIdentitySchema.optional().describe("Who the call acts for, as submitted."),
    timeout_ms: z.number().int().positive().describe("The call's total budget, in ms."),
    attempt_timeout_ms: z
      .number()
      .int()
      .positive()
      .optional()
      .describe("The caller's cap on each attempt, in ms."),
    deadline_at: z
      .number()
      .describe("Epoch ms, by the NATS server's clock, at which the call expires."),
    resolved_at: z
      .number()
      .describe("Epoch ms, by the NATS server's clock, at which the call was accepted."),
    tool_revision: z.number().int().nonnegative().describe("Registry revision resolved against."),
    decision: CallDecisionSchema.optional().describe("Set when a policy set decided the call."),
  })
  .meta({ id: "ResolvedCall", description: "A validated call with defaults filled." });

/** The resolver's output. */
export type ResolvedCall = z.infer<typeof ResolvedCallSchema>;

/** The final message of a call, on `{p}.v1.sessions.{tenant}.{session}.result.{call}`. */
export const ToolMessageSchema = z
  .object({
    role: z.literal("tool"),
    tool_call_id: z.string(),
    name: z.string(),
    content: z
      .string()
      .describe("The result as text (JSON for non-string results) or the error message."),
    error: WireErrorSchema.optional().describe("Present exactly when the call failed."),
    session_id: z.string(),
    attempts: z.number().int().nonnegative().optional(),
    duration_ms: z.number().nonnegative().optional(),
    args_hash: z
      .string()
      .optional()
      .describe(
        "SHA-256 (hex) of the `function.arguments` of the call this message ends, as submitted " +
          "(the JSON text, or the object as JSON.stringify writes it). A submission whose own " +
          "hash or tool differs is not answered by this message: it gets a Rejection.",
      ),
  })
  .meta({ id: "ToolMessage", description: "The one final message of a call: result or error." });

/** The final message of a call. */
export type ToolMessage = z.infer<typeof ToolMessageSchema>;

/**
 * The answer to a submission refused without touching the call its key names, on
 * `{p}.v1.sessions.{tenant}.{session}.rejected.{seq}`: never a final message, so the call
 * that owns the key keeps its own.
 */
export const RejectionSchema = ToolMessageSchema.extend({
  error: WireErrorSchema.describe("Why the submission was refused (`idempotency_conflict`)."),
  seq: z
    .number()
    .int()
    .positive()
    .describe("The refused submission's sequence in the calls stream: its PubAck's `seq`."),
}).meta({
  id: "Rejection",
  description: "A refused submission: its call id and error; the call its key names is unaffected.",
});

/** The answer to a refused submission. */
export type Rejection = z.infer<typeof RejectionSchema>;

/** Progress of a running call, on `{p}.v1.sessions.{tenant}.{session}.progress.{call}`. */
export const ProgressEventSchema = z
  .object({
    tool_call_id: z.string(),
    name: z.string(),
    session_id: z.string(),
    seq: z.number().int().nonnegative().describe("Counts from 0 within one attempt."),
    attempt: z.number().int().positive(),
    data: z.unknown(),
    at: z.number().describe("Epoch ms by the executor's clock."),
  })
  .meta({ id: "ProgressEvent", description: "A progress update emitted by a running tool." });

/** Progress of a running call. */
export type ProgressEvent = z.infer<typeof ProgressEventSchema>;

/** Published on `{p}.v1.events.missing.{tenant}.{tool}` when a call lacks required args. */
export const MissingArgumentsEventSchema = z
  .object({
    tool_call_id: z.string(),
    session_id: z.string(),
    address: SessionAddressSchema,
    tool: z.string(),
    tool_revision: z.number().int().nonnegative(),
    missing_required: z.array(z.string()),
    missing_optional: z.array(z.string()),
    at: z.number(),
  })
  .meta({ id: "MissingArgumentsEvent", description: "A call arrived with required args missing." });

/** A call arrived with required args missing. */
export type MissingArgumentsEvent = z.infer<typeof MissingArgumentsEventSchema>;

/** Reply to a dry-run request on `{p}.v1.rpc.{tenant}.resolve`. */
export const ResolveReplySchema = z
  .union([
    z.object({ ok: z.literal(true), resolved: ResolvedCallSchema }),
    z.object({ ok: z.literal(false), error: WireErrorSchema }),
  ])
  .meta({
    id: "ResolveReply",
    description: "The resolved-call record, or why the call is invalid.",
  });

/** Reply to a dry-run request. */
export type ResolveReply = z.infer<typeof ResolveReplySchema>;

/** Request on `{p}.v1.cancel.{tenant}.{session}`: cancel one call of the session. */
export const CancelRequestSchema = z
  .object({
    tool_call_id: Id,
    session_id: Id,
    idempotency_key: Id.optional().describe("Defaults to `{session_id}/{tool_call_id}`."),
  })
  .meta({ id: "CancelRequest", description: "Asks the mesh to cancel a call." });

/** Asks the mesh to cancel a call. */
export type CancelRequest = z.infer<typeof CancelRequestSchema>;

/** Reply to a cancel request. */
export const CancelReplySchema = z
  .object({
    cancelled: z
      .boolean()
      .describe("True exactly when this request ended an accepted call (state `cancelled`)."),
    state: z
      .enum(["cancelled", "done", "pending", "unknown"])
      .describe(
        "`cancelled`: this request ended the call; `done`: it had already ended; `pending`: no " +
          "call of this session has the key yet, a call that arrives with it is answered " +
          "`cancelled` without running; `unknown`: the request failed (see `error`).",
      ),
    idempotency_key: z
      .string()
      .optional()
      .describe("The key the request acted on (the one sent, else `{session_id}/{tool_call_id}`)."),
    error: WireErrorSchema.optional(),
  })
  .meta({ id: "CancelReply", description: "What became of a cancel request." });

/** Reply to a cancel request. */
export type CancelReply = z.infer<typeof CancelReplySchema>;

// ---- Schema expansion, catalog and tool groups (the schema expander's request-reply) ----

const ToolName = z.string().min(1).max(MAX_TOOL_NAME_LENGTH);
const GroupName = z.string().min(1).max(MAX_TOOL_NAME_LENGTH);

/** Why a tool's full schema was sent to a session. */
export const SchemaReasonSchema = z.enum(["missing_arguments", "expand"]);

/** Why a tool's full schema was sent to a session. */
export type SchemaReason = z.infer<typeof SchemaReasonSchema>;

/**
 * A tool's full schema as a model may see it: preset parameters absent, system parameters
 * removed from `properties` and `required`.
 */
export const ToolSchemaSchema = z
  .object({
    tool: z.string().describe("The tool's registry name."),
    revision: z
      .number()
      .int()
      .nonnegative()
      .describe("Registry revision of the definition the schema was taken from."),
    summary: z.string().describe("The one line of the compact catalog."),
    description: z.string(),
    parameters: JsonObject.describe("JSON Schema (2020-12) of the arguments, an object schema."),
    required: z.array(z.string()).describe("The parameters the model must give."),
    groups: z.array(z.string()),
    progress: z
      .boolean()
      .optional()
      .describe("Whether the tool emits progress events while it runs (its registry entry's)."),
  })
  .meta({ id: "ToolSchema", description: "A tool's full, model-facing parameter schema." });

/** A tool's full, model-facing parameter schema. */
export type ToolSchema = z.infer<typeof ToolSchemaSchema>;

/** Published on `{p}.v1.sessions.{tenant}.{session}.schema.{tool}` by the schema expander. */
export const SchemaEventSchema = ToolSchemaSchema.extend({
  session_id: z.string(),
  reason: SchemaReasonSchema,
  tool_call_id: z
    .string()
    .optional()
    .describe("The incomplete call that caused it (reason `missing_arguments`)."),
  missing: z
    .array(z.string())
    .describe("Required parameters the call left out; empty unless `missing_arguments`."),
  at: z.number().describe("Epoch ms by the schema expander's clock."),
}).meta({
  id: "SchemaEvent",
  description: "A tool's full schema, sent to a session that needs it.",
});

/** A tool's full schema sent to a session. */
export type SchemaEvent = z.infer<typeof SchemaEventSchema>;

/** An agent's output strategy (README.md#tool-groups-tool-sets-agents-and-schema-expansion), as configured. */
export const OutputStrategyConfigSchema = z.object({
  function_calling: z.boolean().default(true).describe("Prefer native function calling."),
  fallback_to_structured_output: z
    .boolean()
    .default(true)
    .describe("Use the structured-output prompt when the model cannot call functions."),
});

/** An agent's output strategy, as configured. */
export type OutputStrategyConfig = z.infer<typeof OutputStrategyConfigSchema>;

/** One tool of a catalog: compact (name and one line) or expanded (with its full schema). */
export const CatalogEntrySchema = z
  .object({
    name: z.string(),
    summary: z.string().describe("One line: the configured summary, else the first sentence."),
    groups: z.array(z.string()),
    revision: z.number().int().nonnegative(),
    progress: z
      .boolean()
      .optional()
      .describe("Whether the tool emits progress events while it runs (its registry entry's)."),
    description: z.string().optional().describe("Expanded entries only."),
    parameters: JsonObject.optional().describe(
      "Expanded entries only: the full model-facing schema.",
    ),
    tool: z
      .string()
      .optional()
      .describe(
        "Catalogs asked for with `names: provider_safe` only: the tool's mesh name, which calls " +
          "name; `name` is then its provider-safe name.",
      ),
  })
  .meta({ id: "CatalogEntry", description: "One tool of a catalog, compact or expanded." });

/** One tool of a catalog. */
export type CatalogEntry = z.infer<typeof CatalogEntrySchema>;

/** Request on `{p}.v1.rpc.{tenant}.catalog`. */
export const CatalogRequestSchema = z
  .object({
    session_id: Id.optional().describe(
      "Filter by the session's groups and agent; tools it has seen come expanded.",
    ),
    agent: Id.optional().describe("Only this agent's tools (its tool sets and tools, merged)."),
    identity: CallerIdentitySchema.optional().describe(
      "Who the catalog is for (the gateway's verified caller); its tenant must be the requester's. Policies see its subject as `context.subject`.",
    ),
    bind_agent: z
      .boolean()
      .default(false)
      .describe("Bind the session to `agent`: from then on it may call only the agent's tools."),
    cursor: z
      .string()
      .regex(/^\d{1,9}$/)
      .optional()
      .describe("The `next_cursor` of the previous page; absent for the first page."),
    names: z
      .enum(["mesh", "provider_safe"])
      .default("mesh")
      .describe(
        "`provider_safe`: each entry's `name` is the tool's provider-safe name (matching " +
          "`^[a-zA-Z0-9_-]{1,64}$`, as OpenAI and Anthropic require) and `tool` its mesh name.",
      ),
  })
  .meta({ id: "CatalogRequest", description: "Asks for the compact catalog." });

/** Asks for the compact catalog. */
export type CatalogRequest = z.input<typeof CatalogRequestSchema>;

const RpcFailureSchema = z.object({ ok: z.literal(false), error: WireErrorSchema });

/** Reply to a catalog request. */
export const CatalogReplySchema = z
  .union([
    z.object({
      ok: z.literal(true),
      tools: z.array(CatalogEntrySchema),
      agent: z.string().optional().describe("The agent the catalog was filtered by."),
      output_strategy: OutputStrategyConfigSchema.optional().describe("The agent's."),
      unavailable: z
        .array(z.string())
        .describe("Tools the agent lists that no executor has registered."),
      next_cursor: z
        .string()
        .optional()
        .describe(
          "Present when more tools follow than fit in one message: ask again with `cursor` set to it.",
        ),
    }),
    RpcFailureSchema,
  ])
  .meta({ id: "CatalogReply", description: "The catalog, or why it cannot be given." });

/** Reply to a catalog request. */
export type CatalogReply = z.infer<typeof CatalogReplySchema>;

/** Request on `{p}.v1.rpc.{tenant}.describe`. */
export const DescribeRequestSchema = z
  .object({
    session_id: Id,
    tools: z.array(ToolName).min(1).max(64),
    agent: Id.optional(),
    identity: CallerIdentitySchema.optional().describe(
      "Who the schemas are for (the gateway's verified caller); its tenant must be the requester's. Policies see its subject as `context.subject`.",
    ),
  })
  .meta({
    id: "DescribeRequest",
    description: "Asks for tools' full schemas now; they count as sent to the session.",
  });

/** Asks for tools' full schemas now. */
export type DescribeRequest = z.input<typeof DescribeRequestSchema>;

/** Reply to a describe request. */
export const DescribeReplySchema = z
  .union([
    z.object({
      ok: z.literal(true),
      schemas: z.array(ToolSchemaSchema),
      errors: z
        .array(z.object({ tool: z.string(), error: WireErrorSchema }))
        .describe("Tools that could not be described: unknown, disabled or not allowed."),
    }),
    RpcFailureSchema,
  ])
  .meta({ id: "DescribeReply", description: "The schemas asked for, and per-tool errors." });

/** Reply to a describe request. */
export type DescribeReply = z.infer<typeof DescribeReplySchema>;

/** Request on `{p}.v1.rpc.{tenant}.expand`. */
export const ExpandRequestSchema = z
  .object({ session_id: Id, tool: ToolName, agent: Id.optional() })
  .meta({
    id: "ExpandRequest",
    description: "Asks for a tool's schema to be sent to the session again.",
  });

/** Asks for a tool's schema to be sent to the session again. */
export type ExpandRequest = z.input<typeof ExpandRequestSchema>;

/** Reply to an expand request. */
export const ExpandReplySchema = z
  .union([z.object({ ok: z.literal(true), schema: ToolSchemaSchema }), RpcFailureSchema])
  .meta({ id: "ExpandReply", description: "The schema that was sent, or why none was." });

/** Reply to an expand request. */
export type ExpandReply = z.infer<typeof ExpandReplySchema>;

/** Request on `{p}.v1.rpc.{tenant}.groups`. */
export const GroupsRequestSchema = z
  .object({
    session_id: Id.optional().describe(
      "Switch for this session only; without it, for every session of the tenant.",
    ),
    enable: z.array(GroupName).max(256).default([]),
    disable: z.array(GroupName).max(256).default([]),
    reset: z
      .array(GroupName)
      .max(256)
      .default([])
      .describe("Drop the switch at this scope: the tenant's (or the default, active) applies."),
  })
  .meta({ id: "GroupsRequest", description: "Lists tool groups, switching some first." });

/** Lists tool groups, switching some first. */
export type GroupsRequest = z.input<typeof GroupsRequestSchema>;

/** One tool group as a session (or the tenant) sees it. */
export const GroupStateSchema = z.object({
  name: z.string(),
  active: z.boolean(),
  source: z
    .enum(["default", "tenant", "session"])
    .describe("Where `active` comes from: no switch (active), the tenant's, the session's."),
  tools: z.array(z.string()).describe("Registered tools in the group."),
});

/** One tool group as a session (or the tenant) sees it. */
export type GroupState = z.infer<typeof GroupStateSchema>;

/** Reply to a groups request. */
export const GroupsReplySchema = z
  .union([
    z.object({
      ok: z.literal(true),
      scope: z.enum(["tenant", "session"]),
      groups: z.array(GroupStateSchema),
    }),
    RpcFailureSchema,
  ])
  .meta({ id: "GroupsReply", description: "Every known group and whether it is active." });

/** Reply to a groups request. */
export type GroupsReply = z.infer<typeof GroupsReplySchema>;

/** Broadcast on `{p}.v1.control.abort` to every executor: stop the call's running attempt. */
export const AbortMessageSchema = z
  .object({
    call_key: z.string().min(1).describe("The call key `{t}.{s}.{k}` of the call to stop."),
    reason: z.enum(["deadline_exceeded", "cancelled"]),
  })
  .meta({ id: "AbortMessage", description: "Stops a call's running attempt on every executor." });

/** Stops a call's running attempt on every executor. */
export type AbortMessage = z.infer<typeof AbortMessageSchema>;
