import type { ToolMessage } from "@toolmesh/protocol";
import { canonicalDigest } from "./chain.js";
import type { AuditEventInput } from "./events.js";
import { AuditEventType } from "./events.js";

/**
 * The event of a call's final message: its outcome (`ok` or the error code) and a digest of
 * the message's content, never the content. Cancellation and deadlines get their own type.
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

/** How a tenant's call arguments are recorded: a digest (default), in full, or redacted. */
export type ArgumentsRecording =
  { kind: "digest" } | { kind: "full" } | { kind: "redacted"; pointers: readonly string[] };

/**
 * The caller's arguments as `recording` records them (never the presets the resolver adds):
 * `{digest}`, `{arguments}` or `{arguments}` with each JSON pointer's value replaced by its digest.
 */
export function redactArguments(
  args: Record<string, unknown>,
  recording: ArgumentsRecording,
): Record<string, unknown> {
  const digest = `sha256:${canonicalDigest(args)}`;
  if (recording.kind === "digest") return { args_digest: digest };
  if (recording.kind === "full") return { args_digest: digest, arguments: args };
  const copy = structuredClone(args);
  for (const pointer of recording.pointers) {
    const path = pointer
      .split("/")
      .slice(1)
      .map((t) => t.replaceAll("~1", "/").replaceAll("~0", "~"));
    const last = path.pop();
    let at: unknown = copy;
    for (const key of path) at = (at as Record<string, unknown> | undefined)?.[key];
    if (last !== undefined && at !== null && typeof at === "object" && last in at) {
      const holder = at as Record<string, unknown>;
      holder[last] = `redacted sha256:${canonicalDigest(holder[last])}`;
    }
  }
  return { args_digest: digest, arguments: copy };
}
