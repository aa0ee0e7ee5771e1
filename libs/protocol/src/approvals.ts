import { z } from "zod";
import { ResolvedCallSchema } from "./envelopes.js";
import { WireErrorSchema } from "./errors.js";

// Calls that wait for a person (docs/policy.md, ADR 0059): what the approvals bucket keeps,
// the event a session gets, and the requests an approver or the caller decides them with.

const Text = z.string().min(1).max(256);

/** Who decides a waiting call: the operator or the tenant's approver, or the caller itself. */
export const ApprovalModeSchema = z.enum(["operator", "caller"]);

/** Who decides a waiting call. */
export type ApprovalMode = z.infer<typeof ApprovalModeSchema>;

/**
 * What a grant is bound to: a decision counts for this call only, and not once the tool's
 * definition or the policy sets in force changed.
 */
export const ApprovalBindingSchema = z.object({
  tenant: z.string(),
  agent: z.string().optional(),
  subject: z.string().optional(),
  tool: z.string(),
  tool_hash: z.string().describe("SHA-256 of the tool's definition when the call was decided."),
  args_hash: z.string().describe("SHA-256 of the canonical arguments (keys sorted)."),
  policy_version: z.string().describe("The versions of the policy sets that asked for approval."),
  policies: z.array(z.string()).describe("Ids of the permits that asked for approval."),
});

/** What a grant is bound to. */
export type ApprovalBinding = z.infer<typeof ApprovalBindingSchema>;

/** A decision on a waiting call: who gave it, when, why. */
export const ApprovalDecisionSchema = z.object({
  effect: z.enum(["approve", "deny", "expire"]),
  by: z
    .string()
    .describe(
      "Who decided: `operator`, `approver:{tenant}`, `caller` (each with `/{name}` when a name was given), or `mesh` for an expiry.",
    ),
  reason: z.string().max(1024).optional(),
  at: z.number().describe("Epoch ms, by the NATS server's clock."),
});

/** A decision on a waiting call. */
export type ApprovalDecision = z.infer<typeof ApprovalDecisionSchema>;

/**
 * States of a waiting call: `waiting` for a decision, `approved` (being routed), `routed` (its
 * work published once), `denied`, `expired`; the last three are final.
 */
export const ApprovalStateSchema = z.enum(["waiting", "approved", "routed", "denied", "expired"]);

/** State of a waiting call. */
export type ApprovalState = z.infer<typeof ApprovalStateSchema>;

/**
 * A call that waits for a person, in the approvals bucket under its call key; changed only by
 * compare-and-set, so one decision wins and the call is routed once.
 */
export const PendingApprovalSchema = z
  .object({
    call: ResolvedCallSchema.describe("The resolved call, routed as it is once approved."),
    submitted_args_hash: z.string().describe("`args_hash` of the arguments as submitted."),
    mode: ApprovalModeSchema,
    binding: ApprovalBindingSchema,
    state: ApprovalStateSchema,
    requested_at: z.number().describe("Epoch ms, by the NATS server's clock."),
    expires_at: z.number().describe("Epoch ms after which nobody can approve it any more."),
    decision: ApprovalDecisionSchema.optional(),
  })
  .meta({ id: "PendingApproval", description: "A call waiting for a person's decision." });

/** A call that waits for a person. */
export type PendingApproval = z.infer<typeof PendingApprovalSchema>;

/**
 * The event on `{p}.v1.sessions.{tenant}.{session}.approval.{call}`: the call was accepted and
 * waits for a decision; its final message comes once decided (or expired).
 */
export const ApprovalRequiredEventSchema = z
  .object({
    tool_call_id: z.string(),
    session_id: z.string(),
    tool: z.string(),
    mode: ApprovalModeSchema,
    requested_at: z.number(),
    expires_at: z.number(),
    policies: z.array(z.string()),
  })
  .meta({
    id: "ApprovalRequiredEvent",
    description: "A call accepted and waiting for a person (`awaiting_approval`).",
  });

/** The event a session gets when one of its calls waits for approval. */
export type ApprovalRequiredEvent = z.infer<typeof ApprovalRequiredEventSchema>;

/**
 * Request on `{p}.v1.approvals.{tenant}` (the operator and the tenant's approver): list the
 * tenant's waiting calls, or approve or deny one by its call id.
 */
export const ApprovalRequestSchema = z
  .discriminatedUnion("op", [
    z.object({ op: z.literal("list") }),
    z.object({
      op: z.enum(["approve", "deny"]),
      call_id: Text,
      session_id: Text.optional().describe("Needed only when the call id is used in two sessions."),
      reason: z.string().max(1024).optional(),
      by: z.string().max(128).optional().describe("A name to record with the decision."),
    }),
  ])
  .meta({ id: "ApprovalRequest", description: "Lists or decides a tenant's waiting calls." });

/** Lists or decides a tenant's waiting calls. */
export type ApprovalRequest = z.infer<typeof ApprovalRequestSchema>;

/** A waiting call as listed. */
export const ApprovalEntrySchema = z.object({
  call_id: z.string(),
  tenant: z.string(),
  session: z.string(),
  idempotency_key: z.string(),
  tool: z.string(),
  args: z.record(z.string(), z.unknown()),
  agent: z.string().optional(),
  mode: ApprovalModeSchema,
  policies: z.array(z.string()),
  policy_version: z.string(),
  requested_at: z.number(),
  expires_at: z.number(),
});

/** A waiting call as listed. */
export type ApprovalEntry = z.infer<typeof ApprovalEntrySchema>;

/** Reply to an {@link ApprovalRequest} or a {@link ConfirmRequest}. */
export const ApprovalReplySchema = z
  .object({
    ok: z.boolean(),
    approvals: z.array(ApprovalEntrySchema).optional().describe("`list`: the waiting calls."),
    decided: z
      .object({ call_id: z.string(), state: ApprovalStateSchema, decision: ApprovalDecisionSchema })
      .optional(),
    error: WireErrorSchema.optional(),
  })
  .meta({ id: "ApprovalReply", description: "Waiting calls, or what a decision did." });

/** Reply to an approval or confirm request. */
export type ApprovalReply = z.infer<typeof ApprovalReplySchema>;

/**
 * Request on `{p}.v1.confirm.{tenant}.{session}`: the caller confirms or declines one of its
 * session's calls that waits for the caller (`@approval("caller")`).
 */
export const ConfirmRequestSchema = z
  .object({
    tool_call_id: Text,
    session_id: Text,
    idempotency_key: Text.optional().describe("Defaults to `{session_id}/{tool_call_id}`."),
    confirm: z.boolean(),
    reason: z.string().max(1024).optional(),
  })
  .meta({ id: "ConfirmRequest", description: "The caller confirms or declines a waiting call." });

/** The caller confirms or declines a waiting call. */
export type ConfirmRequest = z.infer<typeof ConfirmRequestSchema>;
