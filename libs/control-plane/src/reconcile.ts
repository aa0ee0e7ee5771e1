import type { JetStreamClient, JetStreamManager, StoredMsg } from "@nats-io/jetstream";
import { z } from "zod";
import type { Subjects } from "@toolmesh/protocol";
import {
  CallRequestSchema,
  Defaults,
  ErrorCode,
  SessionAddressSchema,
  ToolmeshError,
  callKey,
  decodeJsonOrUndefined,
  encodeJson,
  errorToolMessage,
  idempotencyKeyOf,
  resultMsgId,
} from "@toolmesh/protocol";
import type { CallRef, CallStore } from "@toolmesh/call-store";
import { finalHeaders, nextMessage } from "@toolmesh/nats";
import type { Logger } from "@toolmesh/telemetry";

/** Options of {@link reconcileOrphans}. */
export interface ReconcileOptions {
  jsm: JetStreamManager;
  /** Answers a call that no resolver took (see {@link reconcileOrphans}). */
  js: JetStreamClient;
  subjects: Subjects;
  store: CallStore;
  log: Logger;
  /** Most messages looked at per consumer and pass. Default 10 000. */
  maxScan?: number;
  /**
   * Messages of calls not ended that an earlier pass found below the floor (`stream:seq`),
   * kept by the caller from pass to pass and updated here. Default: a fresh set each pass.
   */
  suspects?: Set<string>;
}

/** What one pass of {@link reconcileOrphans} did. */
export interface ReconcileOutcome {
  /** Messages below their consumer's acknowledgement floor. */
  found: number;
  /** Removed: their call had ended, or they were calls handled long ago. */
  deleted: number;
}

/** Work carries its call's key and session address. */
const KeyedSchema = z.object({ idempotency_key: z.string(), address: SessionAddressSchema });

/**
 * Removes orphaned work-queue messages. After a server is killed, messages its consumers had
 * already acknowledged can reappear in a work-queue stream below the consumer's ack floor,
 * where they are never delivered again and count against the stream's limits. They are read
 * with plain message gets (a work queue allows no second consumer on its subjects), so this
 * runs on the streams exactly as they are created.
 *
 * An acknowledgement means the message was dealt with: a call routed or answered, work whose
 * call ended. The ack floor also passes messages the server gave up on after `max_deliver`
 * (they wait there for the dead-letter keeper), so a message whose call has not ended is
 * handled with care: work is left to the dead-letter and deadline keepers (an orphan of a call
 * not ended is still in the work stream, so the deadline keeper sees it), and a call is acted
 * on only when an earlier pass saw it too (the dead-letter keeper had its chance). A call with
 * a record was routed: it is removed. A call with neither a record nor an answer in the sessions
 * stream was never taken by a resolver, whatever the ack floor says: it is answered
 * `unavailable` (retryable: submit it again) and removed, never dropped unanswered. Deleting
 * decides who acts: replicas reconciling at once never both act on one message.
 */
export async function reconcileOrphans(options: ReconcileOptions): Promise<ReconcileOutcome> {
  const { jsm, subjects } = options;
  const outcome: ReconcileOutcome = { found: 0, deleted: 0 };
  const seen = new Set<string>();
  const streams = [subjects.streams.calls, subjects.streams.work];
  // Every tool owner's work stream (ADR 0041) and every tenant's calls stream (ADR 0048) too.
  for await (const stream of jsm.streams.names(subjects.allOwnerWork))
    if (subjects.isWorkStream(stream)) streams.push(stream);
  for await (const stream of jsm.streams.names(subjects.allTenantStreamCalls))
    if (subjects.isCallsStream(stream)) streams.push(stream);
  for (const stream of streams) {
    for await (const consumer of jsm.consumers.list(stream)) {
      const floor = consumer.ack_floor.stream_seq;
      if (floor === 0) continue;
      const filter = consumer.config.filter_subject || ">";
      await scan(options, stream, filter, floor, outcome, seen);
    }
  }
  if (options.suspects !== undefined) {
    for (const id of options.suspects) if (!seen.has(id)) options.suspects.delete(id);
  }
  return outcome;
}

async function scan(
  options: ReconcileOptions,
  stream: string,
  filter: string,
  floor: number,
  outcome: ReconcileOutcome,
  seen: Set<string>,
): Promise<void> {
  const { jsm, subjects, log } = options;
  const maxScan = options.maxScan ?? Defaults.streamScanLimit;
  let from = 1;
  for (let scanned = 0; scanned < maxScan; scanned++) {
    const msg = await nextMessage(jsm, stream, from, filter);
    if (msg === null || msg.seq > floor) return;
    from = msg.seq + 1;
    outcome.found++;
    const id = `${stream}:${msg.seq}`;
    const key = keyOf(subjects, stream, msg);
    const known = key === undefined ? undefined : await options.store.get(key);
    if (known?.record.state === "done") {
      if (await remove(jsm, stream, msg.seq)) outcome.deleted++;
      continue;
    }
    seen.add(id);
    if (!subjects.isCallsStream(stream)) continue;
    if (options.suspects?.delete(id) !== true) {
      options.suspects?.add(id);
      continue;
    }
    const callId = key?.call_id;
    if (
      key !== undefined &&
      callId !== undefined &&
      known === undefined &&
      !(await answered(options, msg, key.address, callId))
    ) {
      await answerUntaken(options, msg, key, callId);
      if (await remove(jsm, stream, msg.seq)) outcome.deleted++;
      log.warn(
        { stream, seq: msg.seq, callId },
        "call left below its consumer's ack floor that no resolver took; answered unavailable",
      );
    } else {
      if (await remove(jsm, stream, msg.seq)) outcome.deleted++;
      log.warn(
        { stream, seq: msg.seq, callId },
        "call left below its consumer's ack floor; removed",
      );
    }
  }
  log.warn({ stream, filter, maxScan }, "more orphans than one pass looks at; the next goes on");
}

/**
 * Whether the sessions stream holds an answer to a submission: a final message on its call id or
 * a rejection of its sequence (what a refused submission, which makes no record, leaves).
 */
async function answered(
  { jsm, subjects }: ReconcileOptions,
  msg: StoredMsg,
  address: CallRef["address"],
  callId: string,
): Promise<boolean> {
  for (const subject of [subjects.result(address, callId), subjects.rejected(address, msg.seq)]) {
    const found = await jsm.streams.getMessage(subjects.streams.sessions, {
      last_by_subj: subject,
    });
    if (found !== null) return true;
  }
  return false;
}

/**
 * Ends a call no resolver took with a retryable `unavailable`, on its result subject under the
 * message id of its key's final message: a later answer of the same call is dropped as a
 * duplicate, so it has one final message.
 */
async function answerUntaken(
  { js, subjects }: ReconcileOptions,
  msg: StoredMsg,
  key: CallRef,
  callId: string,
): Promise<void> {
  const request = CallRequestSchema.safeParse(decodeJsonOrUndefined(msg.data)).data;
  const message = errorToolMessage(
    {
      tool_call_id: callId,
      name: request?.tool_call.function.name ?? "",
      session_id: request?.session_id ?? key.address.session,
    },
    new ToolmeshError(
      ErrorCode.Unavailable,
      `call ${callId} was lost before a resolver took it (its submission was left below its consumer's acknowledgement floor); submit it again`,
      { retryable: true },
    ),
    { attempts: 0 },
  );
  await js.publish(subjects.result(key.address, callId), encodeJson(message), {
    msgID: resultMsgId(callKey(key.address, key.idempotency_key)),
    headers: finalHeaders(message),
  });
}

/** The call a message belongs to; undefined when the message does not say. */
function keyOf(
  subjects: Subjects,
  stream: string,
  msg: StoredMsg,
): (CallRef & { call_id?: string }) | undefined {
  const body = decodeJsonOrUndefined(msg.data);
  if (!subjects.isCallsStream(stream)) return KeyedSchema.safeParse(body).data;
  const request = CallRequestSchema.safeParse(body).data;
  const address = subjects.parseSessionSubject(msg.subject);
  if (request === undefined || address === undefined) return undefined;
  return {
    address,
    idempotency_key: idempotencyKeyOf(request, request.tool_call.id),
    call_id: request.tool_call.id,
  };
}

async function remove(jsm: JetStreamManager, stream: string, seq: number): Promise<boolean> {
  return jsm.streams.deleteMessage(stream, seq).catch(() => false);
}
