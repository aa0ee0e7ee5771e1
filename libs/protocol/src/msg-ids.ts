import type { SessionAddress } from "./subjects.js";

// Every `Nats-Msg-Id` the mesh publishes under, in one place: the stream's duplicate window
// drops a message published twice under one id, so each id says exactly which message it is
// (which call, which delivery, which stored message) and nothing that changes on a retry.

const RESULT_PREFIX = "result:";

/**
 * `Nats-Msg-Id` of a call's final message: `result:{call key}`. A resubmission answered under
 * another call id (`callToken`, the token of that id) gets `result:{call key}:{call token}`.
 */
export function resultMsgId(callKey: string, callToken?: string): string {
  return callToken === undefined
    ? `${RESULT_PREFIX}${callKey}`
    : `${RESULT_PREFIX}${callKey}:${callToken}`;
}

/** The call key a final message's `Nats-Msg-Id` names; undefined for any other message id. */
export function callKeyOfResultMsgId(msgId: string): string | undefined {
  return msgId.startsWith(RESULT_PREFIX) ? msgId.slice(RESULT_PREFIX.length) : undefined;
}

/**
 * A final message answering one delivery of a call whose record vanished: `result:{call key}:{seq}`
 * (the sessions stream may still remember the call's own `result:{call key}`).
 */
export function deliveryResultMsgId(callKey: string, seq: number): string {
  return `${RESULT_PREFIX}${callKey}:${seq}`;
}

/**
 * The answer to one submission of an invalid call: `result:{call key}:invalid-{seq}`. Per
 * submission, so the call's key can be submitted again, corrected (after `missing_arguments`), and
 * its final message is not taken for this one.
 */
export function invalidResultMsgId(callKey: string, seq: number): string {
  return `${RESULT_PREFIX}${callKey}:invalid-${seq}`;
}

/** The refusal of one delivery of a call whose session is over its in-flight limit. */
export function overloadedMsgId(callKey: string, seq: number): string {
  return `overloaded:${callKey}:${seq}`;
}

/** The refusal of one delivery of a call by a quota. */
export function refusedMsgId(callKey: string, seq: number): string {
  return `refused:${callKey}:${seq}`;
}

/** The rejection of one submission under a key another call holds. */
export function rejectedMsgId(callKey: string, seq: number): string {
  return `rejected:${callKey}:${seq}`;
}

/** The `missing_arguments` event of a call. */
export function missingArgumentsMsgId(callKey: string): string {
  return `missing:${callKey}`;
}

/** A schema sent to a session after `missing_arguments`: one per tool revision. */
export function schemaMsgId(address: SessionAddress, toolToken: string, revision: number): string {
  return `schema:${address.tenant}:${address.session}:${toolToken}:${revision}`;
}

/** The dead letter of the message at `seq` of `stream`. */
export function deadLetterMsgId(stream: string, seq: number): string {
  return `dlq:${stream}:${seq}`;
}

/** Work queued once more from the message at `seq` of `stream`. */
export function requeueMsgId(stream: string, seq: number): string {
  return `requeue:${stream}:${seq}`;
}

/** The replay of the dead letter at `seq` of the dead-letter stream `dlqStream`. */
export function replayMsgId(dlqStream: string, seq: number): string {
  return `replay:${dlqStream}:${seq}`;
}

/**
 * The id of the audit event of one step of one delivery of a call: `audit:{step}:{call key}:{seq}`,
 * `seq` being the submission's sequence in the calls stream. A delivery handled again (the
 * resolver died before acknowledging it) records the same step under the same id, which the
 * audit stream keeps once.
 */
export function auditEventMsgId(step: string, callKey: string, seq: number): string {
  return `audit:${step}:${callKey}:${seq}`;
}

/** The id of the audit event of a final message: `audit:{its Nats-Msg-Id}`. */
export function finalEventMsgId(finalMsgId: string): string {
  return `audit:${finalMsgId}`;
}
