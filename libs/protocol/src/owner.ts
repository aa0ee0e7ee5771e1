import { z } from "zod";
import { WireErrorSchema } from "./errors.js";
import {
  CallDecisionSchema,
  ProgressEventSchema,
  SessionAddressSchema,
  ToolMessageSchema,
} from "./envelopes.js";
import { ToolDefinitionSchema } from "./tool-definition.js";

/** The owner services of the mesh, `{p}.v1.owner.{owner}.{service}` (ADR 0031). */
export const OWNER_SERVICES = [
  "register",
  "unregister",
  "record",
  "finalize",
  "progress",
  "dead-letter",
] as const;

/** One owner service. */
export type OwnerService = (typeof OWNER_SERVICES)[number];

/** Where a call is in its life. */
export const CallStateSchema = z.enum(["accepted", "done"]);

/**
 * The durable record of one accepted call, keyed by its idempotency key. It makes every call
 * end in exactly one final message: whoever moves it to `done` (executor, deadline keeper,
 * dead-letter keeper, cancellation) publishes the final message; everyone else stands down.
 */
export const CallRecordSchema = z
  .object({
    idempotency_key: z.string(),
    call_id: z.string(),
    session_id: z.string(),
    address: SessionAddressSchema,
    tool: z.string(),
    args_hash: z
      .string()
      .describe("SHA-256 of the submitted arguments, to tell a retry from a conflicting reuse."),
    state: CallStateSchema,
    deadline_at: z.number().describe("Server-clock epoch ms at which the call expires."),
    result: ToolMessageSchema.optional().describe("The final message, once `done`."),
    decision: CallDecisionSchema.optional().describe(
      "The policy decision and any approval, when a policy set decided the call.",
    ),
  })
  .meta({ id: "CallRecord", description: "The durable record of one accepted call." });

/** The durable record of one accepted call. */
export type CallRecord = z.infer<typeof CallRecordSchema>;

/** Which call a request names: its idempotency key within its session, and its call id. */
export const OwnerCallSchema = z.object({
  idempotency_key: z.string().min(1),
  call_id: z.string().min(1),
  address: SessionAddressSchema,
});

/** `register`: the mesh files the definition under the owner of the subject. */
export const OwnerRegisterRequestSchema = z
  .object({
    definition: ToolDefinitionSchema.omit({ owner: true, owner_account: true }).extend({
      owner: z.string().optional().describe("Ignored: the owner is the subject's."),
      owner_account: z.boolean().optional().describe("Ignored: set by the mesh."),
    }),
    ack_wait_ms: z
      .number()
      .int()
      .min(1_000)
      .max(600_000)
      .optional()
      .describe("Ack wait of the tool's work consumer, in ms. Default 10 000."),
  })
  .meta({ id: "OwnerRegisterRequest", description: "Registers or updates a tool of an owner." });

/** `register` request. */
export type OwnerRegisterRequest = z.input<typeof OwnerRegisterRequestSchema>;

/** A refusal, `{ ok: false, error }` like every request's (`ok` absent from older meshes). */
const ErrorReply = z.object({
  ok: z.literal(false).optional().describe("Present from meshes that send it: always false."),
  error: WireErrorSchema,
});

/** `register` reply: what happened, or why not. */
export const OwnerRegisterReplySchema = z
  .union([
    z.object({
      status: z.enum(["created", "updated", "unchanged"]),
      revision: z.number().int().positive(),
    }),
    z.object({ status: z.literal("conflict"), owner: z.string() }),
    ErrorReply,
  ])
  .meta({ id: "OwnerRegisterReply", description: "Outcome of a registration." });

/** `register` reply. */
export type OwnerRegisterReply = z.infer<typeof OwnerRegisterReplySchema>;

/** `unregister`: removes a tool the owner holds. */
export const OwnerUnregisterRequestSchema = z
  .object({ name: z.string().min(1) })
  .meta({ id: "OwnerUnregisterRequest", description: "Removes a tool of an owner." });

/** `unregister` reply. */
export const OwnerUnregisterReplySchema = z
  .union([z.object({ removed: z.boolean() }), ErrorReply])
  .meta({ id: "OwnerUnregisterReply", description: "Whether the tool was removed." });

/** `unregister` reply. */
export type OwnerUnregisterReply = z.infer<typeof OwnerUnregisterReplySchema>;

/** `record`: reads the record of a call of one of the owner's tools. */
export const OwnerRecordRequestSchema = z
  .object({ idempotency_key: z.string().min(1), address: SessionAddressSchema })
  .meta({ id: "OwnerRecordRequest", description: "Reads a call's record." });

/** `record` reply: the record and its revision, or `record: null` when there is none. */
export const OwnerRecordReplySchema = z
  .union([
    z.object({ record: CallRecordSchema, revision: z.number().int().positive() }),
    z.object({ record: z.null() }),
    ErrorReply,
  ])
  .meta({ id: "OwnerRecordReply", description: "A call's record, or none." });

/** `record` reply. */
export type OwnerRecordReply = z.infer<typeof OwnerRecordReplySchema>;

/** `finalize`: ends a call with its final message unless it ended already. */
export const OwnerFinalizeRequestSchema = z
  .object({ call: OwnerCallSchema, message: ToolMessageSchema })
  .meta({ id: "OwnerFinalizeRequest", description: "Ends a call with its final message." });

/** `finalize` reply: whether this message became the final one. */
export const OwnerFinalizeReplySchema = z
  .union([z.object({ won: z.boolean() }), ErrorReply])
  .meta({ id: "OwnerFinalizeReply", description: "Whether the message became the final one." });

/** `finalize` reply. */
export type OwnerFinalizeReply = z.infer<typeof OwnerFinalizeReplySchema>;

/** `progress`: a progress event of a running call, published to its session by the mesh. */
export const OwnerProgressRequestSchema = z
  .object({ call: OwnerCallSchema, event: ProgressEventSchema })
  .meta({ id: "OwnerProgressRequest", description: "Progress of a running call." });

/** `dead-letter`: a work message nobody can run, kept in the dead-letter stream. */
export const OwnerDeadLetterRequestSchema = z
  .object({
    tool: z.string().min(1),
    reason: z.string().min(1).max(1_000),
    subject: z.string().min(1),
    seq: z
      .number()
      .int()
      .positive()
      .describe(
        "The message's sequence in the owner's work stream: the mesh dead-letters the message stored there, on `subject`, and refuses a letter for any other.",
      ),
    deliveries: z.number().int().nonnegative(),
    data: z
      .base64()
      .describe(
        "The message's body, base64. Not what is kept: the letter holds the body the work stream stores.",
      ),
  })
  .meta({ id: "OwnerDeadLetterRequest", description: "A work message nobody can run." });

/** `dead-letter` request. */
export type OwnerDeadLetterRequest = z.infer<typeof OwnerDeadLetterRequestSchema>;

/** Reply of `progress` (when asked for one) and `dead-letter`. */
export const OwnerAckReplySchema = z
  .union([z.object({ ok: z.literal(true) }), ErrorReply])
  .meta({ id: "OwnerAckReply", description: "Done, or why not." });

/** Reply of `progress` and `dead-letter`. */
export type OwnerAckReply = z.infer<typeof OwnerAckReplySchema>;
