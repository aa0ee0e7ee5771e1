import { z } from "zod";
import { WireErrorSchema } from "./errors.js";

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

/** Value types of `input_parameters`, in seed 000's vocabulary. */
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
  })
  .meta({ id: "ToolMessage", description: "The one final message of a call: result or error." });

/** The final message of a call. */
export type ToolMessage = z.infer<typeof ToolMessageSchema>;

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
    cancelled: z.boolean().describe("True when this request ended the call."),
    state: z
      .enum(["cancelled", "done", "unknown"])
      .describe("`done`: it had already ended; `unknown`: no such accepted call."),
    error: WireErrorSchema.optional(),
  })
  .meta({ id: "CancelReply", description: "What became of a cancel request." });

/** Reply to a cancel request. */
export type CancelReply = z.infer<typeof CancelReplySchema>;
