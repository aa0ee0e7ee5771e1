import type { NatsConnection } from "@nats-io/nats-core";
import { headers } from "@nats-io/nats-core";
import type { JetStreamClient, JetStreamManager, PubAck } from "@nats-io/jetstream";
import { JetStreamApiError, PubHeaders, jetstream, jetstreamManager } from "@nats-io/jetstream";
import type { Subjects } from "@toolmesh/protocol";
import { JsApiCode, isWrongLastSequence } from "@toolmesh/nats";
import type { ChainTail } from "./chain.js";
import { sealForStore } from "./chain.js";
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
    private readonly nc: NatsConnection,
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
    return new ChainWriter(nc, jetstream(nc), await jetstreamManager(nc), subjects, written);
  }

  /**
   * One attempt to append `batch` after the chain's tail: the batch is sealed as one run of the
   * chain and published back to back, each event expecting the sequence and (after the first)
   * the message id of the one before it. Because of that expectation an event lands only right
   * after its predecessor: when the last is stored, every one before it is, so only the first
   * (whose answer says whether it was a repeat) and the last are acknowledged. When the last is
   * not stored, the tail says how far the run got; the rest is sealed again on the new tail.
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
    const landed = this.#landed(batch, tail);
    if (landed > 0) {
      this.#tails.set(tenant, tail);
      return { written: landed };
    }
    const records: AuditRecord[] = [];
    const acks: Promise<PubAck>[] = [];
    batch.forEach((queued, i) => {
      const { record, data } = sealForStore(
        Object.assign({ v: 1 as const, id: queued.id, tenant, by: queued.by }, queued.event),
        tail,
      );
      // Each event expects the stream's last sequence to be its predecessor's. The first of an
      // empty trail also expects its one subject to hold nothing (sequence 0), which the server
      // checks where it ignores an expected last sequence of 0, so that event is single too. Only
      // then: the server checks a subject's last sequence by loading the stream's last message,
      // and the stream's own from memory. Each event after the first also expects the id of the
      // one before it, so that the predecessor is this batch's event (the sequence alone: another
      // writer's could have taken its place), stored now (the id alone: a repeat of the stream's
      // last event is not stored, and leaves its id last).
      const expect =
        i === 0
          ? { lastSequence: tail.seq, ...(tail.hash === null && { lastSubjectSequence: 0 }) }
          : { lastSequence: tail.seq, lastMsgID: tail.id };
      records.push(record);
      queued.sealed = record.hash;
      tail = { seq: record.seq, hash: record.hash, id: record.id };
      if (i === 0 || i === batch.length - 1) {
        acks.push(this.js.publish(subject, data, { msgID: queued.id, expect }));
      } else {
        this.nc.publish(subject, data, { headers: afterHeaders(queued.id, expect) });
      }
    });
    const settled = await Promise.allSettled(acks);
    return this.#afterBatch(tenant, batch, records, settled);
  }

  /** How many events of `batch`, from the first, end at `tail`: what an earlier attempt wrote. */
  #landed(batch: readonly QueuedEvent[], tail: ChainTail): number {
    return tail.hash === null ? 0 : batch.findIndex((p) => p.sealed === tail.hash) + 1;
  }

  /**
   * What a batch's first and last acks say: how many of its events are written, and why the
   * rest is not. A first event that was a repeat (kept from an earlier attempt) counts as
   * written; after it, the run is known only when the last is stored anew, else from the tail.
   */
  async #afterBatch(
    tenant: string,
    batch: readonly QueuedEvent[],
    records: readonly AuditRecord[],
    [first, last = first]: PromiseSettledResult<PubAck>[],
  ): Promise<BatchOutcome> {
    if (first === undefined || last === undefined) return { written: 0 };
    const stored = (ack: PromiseSettledResult<PubAck>) =>
      ack.status === "fulfilled" && !ack.value.duplicate;
    if (stored(first)) this.#reportWritten(records[0]);
    if (first.status === "fulfilled" && stored(last)) {
      for (const record of records.slice(1)) this.#reportWritten(record);
      const end = records[records.length - 1] as AuditRecord;
      this.#tails.set(tenant, { seq: end.seq, hash: end.hash, id: end.id });
      return { written: records.length };
    }
    // A repeat, or a run that stopped somewhere: the tail is read anew.
    this.#tails.delete(tenant);
    const written = first.status === "fulfilled" ? 1 : 0;
    if (last.status === "fulfilled") return { written };
    const reached = Math.max(written, await this.#reached(tenant, batch));
    const failed = reached === 0 ? first : last;
    const reason: unknown = failed.status === "rejected" ? failed.reason : undefined;
    return { written: reached, failure: isChainRace(reason) ? "raced" : { err: reason } };
  }

  /** How many events of `batch`, from the first, the chain holds now (0 when unreadable). */
  async #reached(tenant: string, batch: readonly QueuedEvent[]): Promise<number> {
    const { subjects } = this;
    try {
      const tail = await readTail(this.jsm, subjects.auditStream(tenant), subjects.audit(tenant));
      this.#tails.set(tenant, tail);
      return this.#landed(batch, tail);
    } catch {
      return 0;
    }
  }

  #reportWritten(record: AuditRecord | undefined): void {
    if (record !== undefined) this.written?.(record.type, Date.now() - record.at);
  }
}

/**
 * The JetStream headers of an event published after another of its batch, without waiting for
 * its acknowledgement: its id, and the sequence and id of the event it must follow.
 */
function afterHeaders(msgID: string, expect: { lastSequence: number; lastMsgID?: string }) {
  const h = headers();
  h.set(PubHeaders.MsgIdHdr, msgID);
  h.set(PubHeaders.ExpectedLastSeqHdr, `${expect.lastSequence}`);
  if (expect.lastMsgID !== undefined) h.set(PubHeaders.ExpectedLastMsgIdHdr, expect.lastMsgID);
  return h;
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
