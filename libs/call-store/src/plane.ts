import type { NatsConnection } from "@nats-io/nats-core";
import type { JetStreamClient, JetStreamManager } from "@nats-io/jetstream";
import { jetstream } from "@nats-io/jetstream";
import type { MsgHdrs } from "@nats-io/nats-core";
import type { ProgressEvent, Subjects, ToolMessage } from "@toolmesh/protocol";
import {
  callKey,
  deadLetterMsgId,
  decodeJsonOrUndefined,
  resultMsgId,
  settledWithin,
} from "@toolmesh/protocol";
import type { StreamLimits } from "@toolmesh/nats";
import {
  ServerClock,
  deadLetterHeaders,
  ensureStreams,
  finalHeaders,
  publishDurable,
  publishEphemeral,
} from "@toolmesh/nats";
import type { AuditTrail } from "@toolmesh/audit";
import { AuditEventType, endedHeader } from "@toolmesh/audit";
import { CallStore } from "./call-store.js";
import type { CallRecord, CallRef } from "./call-store.js";

/** Which call a final message ends. */
export interface CallTarget {
  idempotency_key: string;
  call_id: string;
  address: { tenant: string; session: string };
}

/** Options of {@link openCallPlane}. Durations in ms. */
export interface CallPlaneOptions {
  subjects: Subjects;
  streamLimits?: StreamLimits | undefined;
  /** How long call records are kept (the idempotency horizon), in ms. Default 24 h. */
  callRetentionMs?: number | undefined;
  /** Where final messages and dead letters are recorded (ADR 0060); nothing when undefined. */
  audit?: Pick<AuditTrail, "record" | "written" | "writer" | "required"> | undefined;
}

/** Reads call records. */
export interface CallRecords {
  /** The record of a call, with its revision; undefined when there is none. */
  get(call: CallRef): Promise<{ record: CallRecord; revision: number } | undefined>;
}

/** A work message nobody can run, on its way to the dead-letter stream. */
export interface DeadLetterOut {
  /** The tool whose work it was. */
  tool: string;
  reason: string;
  /** Where the message was: work stream, subject, sequence, deliveries so far. */
  stream: string;
  subject: string;
  seq: number;
  deliveries: number;
  data: Uint8Array;
  headers?: MsgHdrs | undefined;
}

/**
 * What an executor's call path needs of the mesh: reading a call's record, ending a call,
 * progress, dead letters and the server clock. Inside the mesh account it is the streams and
 * buckets themselves ({@link openCallPlane}); from a tool owner's account it is the mesh's
 * owner services (`ownerCallPlane`).
 */
export interface CallPlane {
  readonly store: CallRecords;
  readonly clock: ServerClock;
  /**
   * Ends a call with `message` unless it already ended: moves its record to `done` and
   * publishes the final message. When another party ended the call first, nothing is
   * published — unless the sessions stream does not hold that party's message (it may have
   * died between recording and publishing); then the stored message is published. Returns
   * whether this caller's message became the final one. `verify` sees every record (undefined:
   * none) before it is changed and throws to refuse it. `encoded`, when given, is `message` as
   * `encodeJson` wrote it: a large result is not serialized again.
   */
  finalize: (
    call: CallTarget,
    message: ToolMessage,
    known?: { record: CallRecord; revision: number },
    verify?: (record: CallRecord | undefined) => void,
    encoded?: Uint8Array,
  ) => Promise<boolean>;
  /** Sends a progress event of a running call to its session (best effort, never throws). */
  publishProgress: (call: CallTarget, event: ProgressEvent) => void;
  /** Keeps a work message nobody can run in the dead-letter stream. */
  deadLetter: (letter: DeadLetterOut) => Promise<void>;
}

/**
 * What every actor of the mesh account that ends calls shares: the streams, the call store,
 * the server clock, and the one way final messages go out.
 */
export interface MeshCallPlane extends CallPlane {
  readonly jsm: JetStreamManager;
  readonly js: JetStreamClient;
  readonly store: CallStore;
  /**
   * Publishes a final message to the sessions stream under a message id; `encoded`, when given,
   * is the message as UTF-8 JSON already.
   */
  publishFinal: (
    subject: string,
    message: ToolMessage,
    msgId: string,
    encoded?: Uint8Array,
  ) => Promise<unknown>;
}

/** Creates or updates the streams and opens the call store. */
export async function openCallPlane(
  nc: NatsConnection,
  options: CallPlaneOptions,
): Promise<MeshCallPlane> {
  const { subjects } = options;
  const jsm = await ensureStreams(nc, subjects, options.streamLimits);
  const js = jetstream(nc);
  const store = await CallStore.open(nc, callStoreOptions(options));
  const { audit } = options;
  const publishFinal = finalPublisher(js, subjects, audit);
  const clock = new ServerClock();

  /** Whether a final message is stored on `subject` (false when it cannot be read). */
  async function isStored(subject: string): Promise<boolean> {
    const stored = await jsm.streams
      .getMessage(subjects.streams.sessions, { last_by_subj: subject })
      .catch(() => null);
    return stored !== null;
  }

  return {
    jsm,
    js,
    store,
    clock,
    publishFinal,
    publishProgress(call, event) {
      publishEphemeral(nc, subjects.progress(call.address, call.call_id), event);
    },
    deadLetter: deadLetterPublisher(js, subjects, audit),
    async finalize(call, message, known, verify, encoded) {
      const subject = subjects.result(call.address, call.call_id);
      const outcome = await store.finish(call, message, known, verify, encoded);
      // Live subscribers see every publication, whatever the stream keeps: a loser only
      // publishes when the winner's message is nowhere to be found. The sessions stream is
      // the record of what went out, so the success path writes no "published" mark.
      const msgId = resultMsgId(callKey(call.address, call.idempotency_key));
      if (outcome?.won === false && (await isStored(subject))) return false;
      await publishFinal(
        subject,
        outcome?.result ?? message,
        msgId,
        outcome === undefined ? encoded : outcome.encoded,
      );
      return outcome === undefined || outcome.won;
    },
  };
}

/** The call store's options from the plane's. */
function callStoreOptions(options: CallPlaneOptions): Parameters<typeof CallStore.open>[1] {
  const limits = options.streamLimits;
  return {
    subjects: options.subjects,
    ...(options.callRetentionMs === undefined ? {} : { retentionMs: options.callRetentionMs }),
    ...(limits?.replicas === undefined ? {} : { replicas: limits.replicas }),
    ...(limits?.compression === undefined ? {} : { compression: limits.compression }),
    ...(limits?.storeBytes === undefined ? {} : { storeBytes: limits.storeBytes }),
  };
}

/** Dead-letters a delivery under an id of its place in its stream, and records it. */
function deadLetterPublisher(
  js: JetStreamClient,
  subjects: Subjects,
  audit: CallPlaneOptions["audit"],
): MeshCallPlane["deadLetter"] {
  return async (letter) => {
    const headers = deadLetterHeaders({
      stream: letter.stream,
      subject: letter.subject,
      seq: letter.seq,
      reason: letter.reason,
      deliveries: letter.deliveries,
      headers: letter.headers,
    });
    const ack = await js.publish(subjects.dlq(letter.tool), letter.data, {
      headers,
      msgID: deadLetterMsgId(letter.stream, letter.seq),
    });
    if (audit !== undefined && !ack.duplicate) recordDeadLetter(audit, letter);
  };
}

/**
 * The one way final messages go out ({@link MeshCallPlane.publishFinal}). With an audit trail,
 * the resolvers record each final message the sessions stream stores as its call's end (ADR
 * 0068); the publisher names itself in it, and first waits (when the trail is required, up to
 * {@link ORDER_WAIT_MS}) for the events it recorded before to be written, so that they come
 * before the end in the chain: a refusal, a long attempt's end, a dead letter.
 */
function finalPublisher(
  js: JetStreamClient,
  subjects: Subjects,
  audit: CallPlaneOptions["audit"],
): MeshCallPlane["publishFinal"] {
  return async (subject, message, msgId, encoded) => {
    const tenant = audit?.required && subjects.parseResultSubject(subject)?.address.tenant;
    if (tenant) await settledWithin(audit.written(tenant), ORDER_WAIT_MS);
    return publishDurable(js, subject, encoded ?? message, {
      msgId,
      headers: finalHeaders(message, audit && endedHeader(message, audit.writer)),
    });
  };
}

/** Longest a final message waits for the events its publisher recorded before it. */
const ORDER_WAIT_MS = 10_000;

/** Records a dead letter in its call's tenant's trail, when the letter is a routed call. */
function recordDeadLetter(audit: Pick<AuditTrail, "record">, letter: DeadLetterOut): void {
  const call = decodeJsonOrUndefined(letter.data) as
    { call_id?: unknown; session_id?: unknown; address?: { tenant?: unknown } } | undefined;
  const tenant = call?.address?.tenant;
  if (typeof tenant !== "string") return;
  void audit.record(tenant, {
    type: AuditEventType.DeadLettered,
    call_id: typeof call?.call_id === "string" ? call.call_id : undefined,
    session: typeof call?.session_id === "string" ? call.session_id : undefined,
    tool: letter.tool,
    at: Date.now(),
    data: { reason: letter.reason, deliveries: letter.deliveries, stream: letter.stream },
  });
}
