import type { NatsConnection } from "@nats-io/nats-core";
import type { JetStreamManager } from "@nats-io/jetstream";
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
}

/** One stored event: its stream sequence and what the stream holds (undefined: not JSON). */
export interface StoredEvent {
  seq: number;
  record: unknown;
}

/** Reads a tenant's audit stream in order (an ordered consumer: nothing is left behind). */
export async function* readTrail(
  nc: NatsConnection,
  subjects: Subjects,
  tenant: string,
  options: ReadTrailOptions = {},
): AsyncGenerator<StoredEvent> {
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
  options: { sinceMs?: number | undefined } = {},
): Promise<VerifyOutcome> {
  const verifier = new ChainVerifier(subjectToken(tenant));
  let anchored = options.sinceMs === undefined;
  const jsm = await jetstreamManager(nc);
  for await (const { seq, record } of readTrail(nc, subjects, tenant, options)) {
    if (!anchored) {
      anchored = true;
      const anchor = await anchorBefore(jsm, subjects.auditStream(subjectToken(tenant)), seq);
      if (anchor !== undefined) verifier.anchor(anchor);
    }
    const broken = verifier.check(seq, record);
    if (broken !== undefined) return { ok: false, count: verifier.count, broken };
  }
  return { ok: true, count: verifier.count };
}

/** The event before `seq`, when it is stored and its own hash holds. */
async function anchorBefore(
  jsm: JetStreamManager,
  stream: string,
  seq: number,
): Promise<{ seq: number; hash: string } | undefined> {
  if (seq <= 1) return undefined;
  const msg = await jsm.streams.getMessage(stream, { seq: seq - 1 }).catch(() => null);
  const record =
    msg === null ? undefined : (decodeJsonOrUndefined(msg.data) as AuditRecord | undefined);
  if (record === undefined || record.hash !== recordHash(record)) return undefined;
  return { seq: seq - 1, hash: record.hash };
}
