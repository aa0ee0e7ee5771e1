import type { NatsConnection } from "@nats-io/nats-core";
import { setTimeout as sleep } from "node:timers/promises";
import type { JetStreamManager, StoredMsg } from "@nats-io/jetstream";
import { DeliverPolicy, jetstream, jetstreamManager } from "@nats-io/jetstream";
import type { Subjects } from "@toolmesh/protocol";
import { decodeJsonOrUndefined, subjectToken } from "@toolmesh/protocol";
import type { BrokenLink } from "./chain.js";
import { ChainVerifier, recordHash } from "./chain.js";
import type { AuditRecord } from "./events.js";

/** Options of {@link readTrail}. */
export interface ReadTrailOptions {
  /** Only events stored at or after this time (ms since the epoch). */
  sinceMs?: number | undefined;
  /** Keep reading events as they are written, until `signal` aborts. */
  follow?: boolean | undefined;
  signal?: AbortSignal | undefined;
  /**
   * Read by direct get, one event per request, as a tenant's approver does from the tenant's
   * account (no consumer crosses accounts; docs/audit.md). Default: an ordered consumer.
   */
  direct?: boolean | undefined;
}

/** One stored event: its stream sequence and what the stream holds (undefined: not JSON). */
export interface StoredEvent {
  seq: number;
  record: unknown;
}

/** How often a direct reader that follows the trail looks for new events, in ms. */
const FOLLOW_POLL_MS = 1_000;

/** Reads a tenant's audit stream in order: nothing is left behind. */
export async function* readTrail(
  nc: NatsConnection,
  subjects: Subjects,
  tenant: string,
  options: ReadTrailOptions = {},
): AsyncGenerator<StoredEvent> {
  if (options.direct === true) {
    yield* new DirectTrail(nc, subjects, tenant).events(options);
    return;
  }
  const stream = subjects.auditStream(subjectToken(tenant));
  const jsm = await jetstreamManager(nc);
  const info = await jsm.streams.info(stream);
  if (info.state.messages === 0 && options.follow !== true) return;
  const js = jetstream(nc);
  const consumer = await js.consumers.get(
    stream,
    options.sinceMs === undefined
      ? { deliver_policy: DeliverPolicy.All }
      : {
          deliver_policy: DeliverPolicy.StartTime,
          opt_start_time: new Date(options.sinceMs).toISOString(),
        },
  );
  const messages = await consumer.consume();
  const stop = (): void => void messages.stop();
  options.signal?.addEventListener("abort", stop, { once: true });
  try {
    for await (const m of messages) {
      yield { seq: m.seq, record: decodeJsonOrUndefined(m.data) };
      if (options.follow !== true && m.info.pending === 0) break;
    }
  } finally {
    options.signal?.removeEventListener("abort", stop);
    await messages.close().catch(() => undefined);
  }
}

/**
 * A tenant's trail read with the one request its approver may make across accounts (an account
 * without JetStream answers the rest of the JetStream API itself): direct gets, of the next
 * event at or after a sequence and of the last one. Each event is one request; a start time is
 * found by bisecting on stored times.
 */
class DirectTrail {
  readonly #jsm: Promise<JetStreamManager>;
  readonly #stream: string;
  readonly #subject: string;

  constructor(nc: NatsConnection, subjects: Subjects, tenant: string) {
    this.#jsm = jetstreamManager(nc, { checkAPI: false });
    const token = subjectToken(tenant);
    this.#stream = subjects.auditStream(token);
    this.#subject = subjects.audit(token);
  }

  /** The event at `seq` or the first after it; null past the last. */
  async at(seq: number): Promise<StoredMsg | null> {
    const jsm = await this.#jsm;
    return jsm.direct.getMessage(this.#stream, { seq, next_by_subj: this.#subject });
  }

  /** The sequence of the last event; 0 when there is none. */
  async #last(): Promise<number> {
    const jsm = await this.#jsm;
    return (await jsm.direct.getMessage(this.#stream, { last_by_subj: this.#subject }))?.seq ?? 0;
  }

  async *events(options: ReadTrailOptions): AsyncGenerator<StoredEvent> {
    let last = await this.#last();
    let seq = options.sinceMs === undefined ? 1 : await this.#firstAt(last, options.sinceMs);
    for (;;) {
      while (seq <= last && options.signal?.aborted !== true) {
        const m = await this.at(seq);
        if (m === null) break;
        yield { seq: m.seq, record: decodeJsonOrUndefined(m.data) };
        seq = m.seq + 1;
      }
      if (options.follow !== true || options.signal?.aborted === true) return;
      await sleep(FOLLOW_POLL_MS, undefined, { signal: options.signal }).catch(() => undefined);
      last = await this.#last();
    }
  }

  /** The sequence of the first event stored at or after `sinceMs` (`last + 1` when none). */
  async #firstAt(last: number, sinceMs: number): Promise<number> {
    let low = 1;
    let high = last + 1;
    while (low < high) {
      const mid = Math.floor((low + high) / 2);
      const m = await this.at(mid);
      if (m === null || m.time.getTime() >= sinceMs) high = mid;
      else low = m.seq + 1;
    }
    return low;
  }
}

/** What `audit verify` found. */
export type VerifyOutcome =
  { ok: true; count: number } | { ok: false; count: number; broken: BrokenLink };

/**
 * Recomputes a tenant's chain (from `sinceMs`, anchored on the event before it): every event's
 * hash, sequence and link to the one before. The first broken link, or how many events passed.
 */
export async function verifyTrail(
  nc: NatsConnection,
  subjects: Subjects,
  tenant: string,
  options: { sinceMs?: number | undefined; direct?: boolean | undefined } = {},
): Promise<VerifyOutcome> {
  const verifier = new ChainVerifier(subjectToken(tenant));
  let anchored = options.sinceMs === undefined;
  const before =
    options.direct === true
      ? (seq: number) => new DirectTrail(nc, subjects, tenant).at(seq)
      : // Null only when the event is gone; a read that fails fails the verification, which
        // must not start unanchored as if the trail began there.
        async (seq: number) =>
          (await jetstreamManager(nc)).streams.getMessage(
            subjects.auditStream(subjectToken(tenant)),
            { seq },
          );
  for await (const { seq, record } of readTrail(nc, subjects, tenant, options)) {
    if (!anchored) {
      anchored = true;
      const anchor = await anchorBefore(before, seq);
      if (anchor !== undefined) verifier.anchor(anchor);
    }
    const broken = verifier.check(seq, record);
    if (broken !== undefined) return { ok: false, count: verifier.count, broken };
  }
  return { ok: true, count: verifier.count };
}

/** The event before `seq`, when it is stored and its own hash holds. */
async function anchorBefore(
  get: (seq: number) => Promise<StoredMsg | null>,
  seq: number,
): Promise<{ seq: number; hash: string } | undefined> {
  if (seq <= 1) return undefined;
  const msg = await get(seq - 1);
  if (msg === null || msg.seq !== seq - 1) return undefined;
  const record = decodeJsonOrUndefined(msg.data) as AuditRecord | undefined;
  if (record === undefined || record.hash !== recordHash(record)) return undefined;
  return { seq: seq - 1, hash: record.hash };
}
