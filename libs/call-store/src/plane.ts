import type { NatsConnection } from "@nats-io/nats-core";
import type { JetStreamClient, JetStreamManager } from "@nats-io/jetstream";
import { jetstream } from "@nats-io/jetstream";
import type { Subjects, ToolMessage } from "@toolmesh/protocol";
import { callKey, resultMsgId } from "@toolmesh/protocol";
import type { StreamLimits } from "@toolmesh/nats";
import { ServerClock, ensureStreams, publishDurable } from "@toolmesh/nats";
import { CallStore } from "./call-store.js";
import type { CallRecord } from "./call-store.js";

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
}

/**
 * What every actor that ends calls shares: the streams, the call store, the server clock, and
 * the one way final messages go out.
 */
export interface CallPlane {
  readonly jsm: JetStreamManager;
  readonly js: JetStreamClient;
  readonly store: CallStore;
  readonly clock: ServerClock;
  /** Publishes a final message to the sessions stream under a message id. */
  publishFinal: (subject: string, message: ToolMessage, msgId: string) => Promise<unknown>;
  /**
   * Ends a call with `message` unless it already ended: moves its record to `done` and
   * publishes the final message. When another party ended the call first, nothing is
   * published — unless the sessions stream does not hold that party's message (it may have
   * died between recording and publishing); then the stored message is published. Returns
   * whether this caller's message became the final one.
   */
  finalize: (
    call: CallTarget,
    message: ToolMessage,
    known?: { record: CallRecord; revision: number },
  ) => Promise<boolean>;
}

/** Creates or updates the streams and opens the call store. */
export async function openCallPlane(
  nc: NatsConnection,
  options: CallPlaneOptions,
): Promise<CallPlane> {
  const { subjects } = options;
  const jsm = await ensureStreams(nc, subjects, options.streamLimits);
  const js = jetstream(nc);
  const store = await CallStore.open(nc, {
    subjects,
    ...(options.callRetentionMs === undefined ? {} : { retentionMs: options.callRetentionMs }),
    ...(options.streamLimits?.replicas === undefined
      ? {}
      : { replicas: options.streamLimits.replicas }),
  });
  const publishFinal = (subject: string, message: ToolMessage, msgId: string): Promise<unknown> =>
    publishDurable(js, subject, message, { msgId });

  async function alreadyStored(subject: string): Promise<boolean> {
    const stored = await jsm.streams
      .getMessage(subjects.streams.sessions, { last_by_subj: subject })
      .catch(() => null);
    return stored !== null;
  }

  return {
    jsm,
    js,
    store,
    clock: new ServerClock(),
    publishFinal,
    async finalize(call, message, known) {
      const subject = subjects.result(call.address, call.call_id);
      const outcome = await store.finish(call, message, known);
      // Live subscribers see every publication, whatever the stream keeps: a loser only
      // publishes when the winner's message is nowhere to be found. The sessions stream is
      // the record of what went out, so the success path writes no "published" mark.
      if (outcome?.won === false && (await alreadyStored(subject))) return false;
      await publishFinal(
        subject,
        outcome?.result ?? message,
        resultMsgId(callKey(call.address, call.idempotency_key)),
      );
      return outcome === undefined || outcome.won;
    },
  };
}
