import { z } from "zod";

/** What an audit event records (ADR 0060). Codes as an `as const` object and a derived union. */
export const AuditEventType = {
  /** Admission let the call go to its tool's work (or hold it for a fair turn). */
  Admitted: "call.admitted",
  /** The call was answered with an error before it ran: `data.code` says why. */
  Refused: "call.refused",
  /** A policy set decided the call: `data.effect`, `data.policies`, `data.version`. */
  PolicyDecided: "policy.decided",
  /** An approval was asked for: `data.approvers`, `data.reason`. */
  ApprovalRequested: "approval.requested",
  /** An approval was decided: `data.decision`, `data.by`, `data.reason`. */
  ApprovalDecided: "approval.decided",
  /** An executor started an attempt: `data.executor`, `data.attempt`. */
  AttemptStarted: "attempt.started",
  /** An attempt ended: `data.executor`, `data.attempt`, `data.duration_ms`, `data.outcome`. */
  AttemptEnded: "attempt.ended",
  /** The call was cancelled. */
  Cancelled: "call.cancelled",
  /** The call passed its deadline. */
  DeadlineExceeded: "call.deadline_exceeded",
  /** The call's work was dead-lettered: `data.reason`. */
  DeadLettered: "call.dead_lettered",
  /** The call's final message went out: `data.outcome` (`ok` or an error code), `data.result_digest`. */
  Ended: "call.ended",
} as const;

/** One of {@link AuditEventType}. */
export type AuditEventType = (typeof AuditEventType)[keyof typeof AuditEventType];

/** What a service records: the event without its place in the chain. `at` in ms since the epoch. */
export interface AuditEventInput {
  /**
   * The step's own event id, the same each time the step is done again (a redelivered call),
   * so that the trail keeps it once; a fresh one when absent. `auditEventMsgId` makes them.
   */
  id?: string | undefined;
  type: AuditEventType;
  /** The process that did the step, when another writes its event; the writer by default. */
  by?: string | undefined;
  call_id?: string | undefined;
  session?: string | undefined;
  tool?: string | undefined;
  at: number;
  data: Record<string, unknown>;
}

/** One stored event of a tenant's chain. */
export const AuditRecordSchema = z
  .object({
    v: z.literal(1),
    /** Its sequence in the tenant's audit stream: a gap or a repeat breaks the chain. */
    seq: z.number().int().positive(),
    /**
     * The message id that keeps a retried write single: the step's own (the same each time the
     * step is done again, so the stream keeps it once) or a random one.
     */
    id: z.string().min(1),
    tenant: z.string().min(1),
    type: z.enum(Object.values(AuditEventType) as [AuditEventType, ...AuditEventType[]]),
    call_id: z.string().optional(),
    session: z.string().optional(),
    tool: z.string().optional(),
    at: z.number(),
    /** The process that wrote it (`resolver@host/pid`). */
    by: z.string(),
    data: z.record(z.string(), z.unknown()),
    /** The hash of the tenant's previous event; null for the first. */
    prev: z.string().nullable(),
    /** sha256 (hex) of the RFC 8785 canonical JSON of every other field. */
    hash: z.string(),
  })
  .strict();

/** One stored event of a tenant's chain. */
export type AuditRecord = z.infer<typeof AuditRecordSchema>;
