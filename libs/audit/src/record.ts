import jsonpointer from "jsonpointer";
import type { ToolMessage } from "@toolmesh/protocol";
import { canonicalDigest } from "./chain.js";
import type { AuditEventInput } from "./events.js";
import { AuditEventType } from "./events.js";

/**
 * The event of a call's final message: its outcome (`ok` or the error code), a digest of the
 * message's content (never the content), and its attempts and duration when it says them. Cancellation and deadlines get their own type.
 */
export function callEnded(message: ToolMessage, at = Date.now()): AuditEventInput {
  const code = message.error?.code;
  const type =
    code === "cancelled"
      ? AuditEventType.Cancelled
      : code === "deadline_exceeded"
        ? AuditEventType.DeadlineExceeded
        : AuditEventType.Ended;
  return {
    type,
    call_id: message.tool_call_id,
    session: message.session_id,
    tool: message.name,
    at,
    data: {
      outcome: code ?? "ok",
      result_digest: `sha256:${canonicalDigest(message.content)}`,
      ...(message.args_hash === undefined ? {} : { args_hash: message.args_hash }),
      // How many attempts ran and for how long: for the calls of tools in an owner's account,
      // whose executors write no attempt events, this is how the trail shows them.
      ...(message.attempts === undefined ? {} : { attempts: message.attempts }),
      ...(message.duration_ms === undefined ? {} : { duration_ms: message.duration_ms }),
    },
  };
}

/** An approval asked for: the one function the approval flow calls. */
export function approvalRequested(call: {
  call_id: string;
  session: string;
  tool: string;
  approvers: readonly string[];
  reason?: string | undefined;
}): AuditEventInput {
  const { call_id, session, tool, ...data } = call;
  return { type: AuditEventType.ApprovalRequested, call_id, session, tool, at: Date.now(), data };
}

/** An approval decided (by whom, why): the one function the approval flow calls. */
export function approvalDecided(call: {
  call_id: string;
  session: string;
  tool: string;
  decision: "approved" | "denied";
  by: string;
  reason?: string | undefined;
}): AuditEventInput {
  const { call_id, session, tool, ...data } = call;
  return { type: AuditEventType.ApprovalDecided, call_id, session, tool, at: Date.now(), data };
}

/**
 * How a tenant's call arguments are recorded in `call.admitted`: as the digest alone (the
 * default: `args_hash`), in full, or in full with the value at each JSON pointer (RFC 6901)
 * replaced by `"[redacted]"`.
 */
export type ArgumentsRecording =
  { kind: "digest" } | { kind: "full" } | { kind: "redacted"; pointers: readonly string[] };

/**
 * What `call.admitted` records of the arguments besides their digest: nothing, `{arguments}`,
 * or `{arguments}` with each pointer's value redacted (a pointer that names nothing is skipped).
 */
export function recordedArguments(
  args: Record<string, unknown>,
  recording: ArgumentsRecording,
): { arguments?: Record<string, unknown> } {
  if (recording.kind === "digest") return {};
  if (recording.kind === "full") return { arguments: args };
  const copy = structuredClone(args);
  for (const pointer of recording.pointers) {
    if (jsonpointer.get(copy, pointer) !== undefined) jsonpointer.set(copy, pointer, REDACTED);
  }
  return { arguments: copy };
}

const REDACTED = "[redacted]";
