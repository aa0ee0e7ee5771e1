import type { NatsConnection } from "@nats-io/nats-core";
import type { JetStreamClient, JetStreamManager, PubAck } from "@nats-io/jetstream";
import { JetStreamApiError, jetstream, jetstreamManager } from "@nats-io/jetstream";
import type { Subjects } from "@toolmesh/protocol";
import { JsApiCode, isWrongLastSequence } from "@toolmesh/nats";
import type { ChainTail } from "./chain.js";
import { sealRecord } from "./chain.js";
import type { AuditRecord } from "./events.js";
import type { BatchOutcome, BatchWriter, QueuedEvent } from "./writer.js";

/**
 * Appends events to their tenant's chain (ADR 0060): each event carries the hash of the one
 * before and is written with the expected last sequence, so writers in many processes keep one
 * order (one that loses the race reads the tail again and retries). Keeps each tenant's tail
 * as last written or read.
 */
export class ChainWriter implements BatchWriter {
  readonly #tails = new Map<string, ChainTail>();

  private constructor(
    private readonly js: JetStreamClient,
    private readonly jsm: JetStreamManager,
    private readonly subjects: Subjects,
    private readonly written?: (type: string, lagMs: number) => void,
  ) {}

  static async open(
    nc: NatsConnection,
    subjects: Subjects,
    written?: (type: string, lagMs: number) => void,
  ): Promise<ChainWriter> {
    return new ChainWriter(jetstream(nc), await jetstreamManager(nc), subjects, written);
  }

  /**
   * One attempt to append `batch` after the chain's tail: the batch is sealed as one run of the
   * chain and published back to back, each event expecting the sequence and (after the first)
   * the message id of the one before it, and the acks are awaited together. Because of that
   * expectation an event lands only right after its predecessor, so the written events are the
   * run up to the last one acknowledged; the rest is written again after the tail is read anew.
   */
  async write(tenant: string, batch: readonly QueuedEvent[]): Promise<BatchOutcome> {
    const stream = this.subjects.auditStream(tenant);
    const subject = this.subjects.audit(tenant);
    let tail: ChainTail;
    try {
      tail = this.#tails.get(tenant) ?? (await readTail(this.jsm, stream, subject));
    } catch (err) {
      return { written: 0, failure: { err } };
    }
    // Earlier attempts whose answers were lost may have landed: the tail is then the last of
    // them, exactly as this process sealed it (its id alone could be a step recorded before).
    const landed = tail.hash === null ? -1 : batch.findIndex((p) => p.sealed === tail.hash);
    if (landed >= 0) {
      this.#tails.set(tenant, tail);
      return { written: landed + 1 };
    }
    const records: AuditRecord[] = [];
    const acks = batch.map((queued, i) => {
      const record = sealRecord(
        { v: 1, id: queued.id, tenant, by: queued.by, ...queued.event },
        tail,
      );
      const expect = { lastSequence: tail.seq, streamName: stream };
      // The server ignores an expected last sequence of 0; the stream's one subject's last
      // sequence is checked even when 0, so the first event of an empty trail is single too.
      const after =
        i === 0
          ? { lastSubjectSequence: tail.hash === null ? 0 : tail.seq }
          : { lastMsgID: tail.id };
      records.push(record);
      queued.sealed = record.hash;
      tail = { seq: record.seq, hash: record.hash, id: record.id };
      return this.js.publish(subject, JSON.stringify(record), {
        msgID: queued.id,
        expect: { ...expect, ...after },
      });
    });
    return this.#afterBatch(tenant, records, await Promise.allSettled(acks));
  }

  /** What a batch's acks say: how many of its events are written, and why the rest is not. */
  #afterBatch(
    tenant: string,
    records: readonly AuditRecord[],
    settled: readonly PromiseSettledResult<PubAck>[],
  ): BatchOutcome {
    let written = 0;
    let duplicate = false;
    settled.forEach((result, i) => {
      if (result.status !== "fulfilled") return;
      written = i + 1;
      duplicate = result.value.duplicate;
      const record = records[i] as AuditRecord;
      if (!duplicate) this.written?.(record.type, Date.now() - record.at);
    });
    const last = records[written - 1];
    // A duplicate landed in an earlier attempt, somewhere before: the tail is read anew.
    if (last === undefined || duplicate) this.#tails.delete(tenant);
    else this.#tails.set(tenant, { seq: last.seq, hash: last.hash, id: last.id });
    const first = settled[written];
    if (first === undefined || first.status === "fulfilled") return { written };
    this.#tails.delete(tenant);
    return { written, failure: isChainRace(first.reason) ? "raced" : { err: first.reason } };
  }
}

/** Another writer appended first: the expected last sequence or message id is not the tail. */
function isChainRace(err: unknown): boolean {
  return (
    isWrongLastSequence(err) ||
    (err instanceof JetStreamApiError && err.code === JsApiCode.StreamWrongLastMsgId)
  );
}

/**
 * The last event of a tenant's audit stream (sequence 0, no hash when it is empty): one request
 * for the last message on the stream's one subject; the stream's state only when it has none.
 */
export async function readTail(
  jsm: JetStreamManager,
  stream: string,
  subject: string,
): Promise<ChainTail> {
  const msg = await jsm.streams.getMessage(stream, { last_by_subj: subject });
  if (msg !== null) {
    const record = msg.json<AuditRecord>();
    return { seq: msg.seq, hash: record.hash, id: record.id };
  }
  // Empty: every event aged out (or none was written); the next one follows the last sequence.
  const info = await jsm.streams.info(stream);
  return { seq: info.state.last_seq, hash: null };
}
