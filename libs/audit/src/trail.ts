import { randomUUID } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import type { NatsConnection } from "@nats-io/nats-core";
import type { JetStreamClient, JetStreamManager, PubAck } from "@nats-io/jetstream";
import { JetStreamApiError, jetstream, jetstreamManager } from "@nats-io/jetstream";
import type { Subjects } from "@toolmesh/protocol";
import { ErrorCode, ToolmeshError } from "@toolmesh/protocol";
import { JsApiCode, isWrongLastSequence } from "@toolmesh/nats";
import type { ChainTail } from "./chain.js";
import { sealRecord } from "./chain.js";
import type { AuditEventInput, AuditRecord } from "./events.js";
import type { ArgumentsRecording } from "./record.js";
import { recordedArguments } from "./record.js";

/** `required`: a call whose admission cannot be recorded is refused; `best-effort`: it runs. */
export type AuditMode = "required" | "best-effort";

/** What the trail reports to metrics and logs; telemetry never throws into it. */
export interface AuditTrailObserver {
  auditWritten(type: string, lagMs: number): void;
  auditWriteFailed(): void;
}

/** Options of {@link AuditTrail}. Durations in ms. */
export interface AuditTrailOptions {
  subjects: Subjects;
  mode: AuditMode;
  /** Names the writing process in each event (`resolver@host/pid`). */
  writer: string;
  observer?: AuditTrailObserver | undefined;
  /** Called once per failing tenant when writes start failing, and when they pass again. */
  onHealth?: ((tenant: string, healthy: boolean, err?: unknown) => void) | undefined;
  /** First and longest pause between retries of a failed write. Default 100 and 5 000. */
  retryMinMs?: number | undefined;
  retryMaxMs?: number | undefined;
  /** How each tenant's arguments are recorded (by tenant token); a tenant not named: digest. */
  argumentsRecording?: ReadonlyMap<string, ArgumentsRecording> | undefined;
  /** Most events published in one run before their acks are awaited. Default 256. */
  batchMax?: number | undefined;
}

interface Pending {
  event: Omit<AuditEventInput, "id">;
  id: string;
  /** Settled after the first attempt: whether the event was written. */
  first?: ((written: boolean) => void) | undefined;
  /** Withdrawn instead of retried when its first attempt fails. */
  withdrawOnFailure: boolean;
  /** The hash of the record last published for it: whether an attempt whose answer was lost landed. */
  sealed?: string | undefined;
  done: () => void;
}

/** One tenant's chain as this process writes it. */
class TenantChain {
  readonly queue: Pending[] = [];
  tail: ChainTail | undefined;
  failing = false;
  pumping = false;
  constructor(
    readonly tenant: string,
    readonly stream: string,
    readonly subject: string,
  ) {}
}

/**
 * Writes audit events into their tenant's audit stream (ADR 0060), one chain per tenant: each
 * event carries the hash of the tenant's previous event and is written with the expected last
 * sequence, so writers in many processes keep one order (a writer that loses the race reads the
 * tail again and retries). Events of a tenant are written in the order they were recorded; a
 * failed write is retried with backoff until it passes, never dropped. Tenants are named by
 * their subject token (`SessionAddress.tenant`).
 */
export class AuditTrail {
  readonly #js: JetStreamClient;
  readonly #jsm: JetStreamManager;
  readonly #options: AuditTrailOptions;
  readonly #chains = new Map<string, TenantChain>();
  readonly #stop = new AbortController();
  // Waiting for every event recorded to be written (settle).
  #idle: (() => void)[] = [];

  private constructor(js: JetStreamClient, jsm: JetStreamManager, options: AuditTrailOptions) {
    this.#js = js;
    this.#jsm = jsm;
    this.#options = options;
  }

  /** Opens a trail on the mesh account's connection. */
  static async open(nc: NatsConnection, options: AuditTrailOptions): Promise<AuditTrail> {
    return new AuditTrail(jetstream(nc), await jetstreamManager(nc), options);
  }

  /** Whether admissions must be recorded before calls go on. */
  get required(): boolean {
    return this.#options.mode === "required";
  }

  /**
   * Records `event` in `tenant`'s chain. Resolves when it is written; a failed write is retried
   * until it passes (the promise waits), so callers that must not wait need not await.
   */
  record(tenant: string, event: AuditEventInput): Promise<void> {
    return new Promise((resolve) => {
      this.#enqueue(tenant, { ...identified(event), withdrawOnFailure: false, done: resolve });
    });
  }

  /**
   * Records `event` and resolves once its first write is done: true when written, false when it
   * failed (the event is kept and retried, as {@link record}'s are).
   */
  recordAndWait(tenant: string, event: AuditEventInput): Promise<boolean> {
    return this.#recordFirst(tenant, event, false);
  }

  /**
   * Records `event` if its first write passes: true when written, false when that write failed
   * and the event was withdrawn (the fact it records must then not happen, e.g. an admission
   * in `required` mode). Events recorded before it are written first.
   */
  tryRecord(tenant: string, event: AuditEventInput): Promise<boolean> {
    return this.#recordFirst(tenant, event, true);
  }

  /** Records `event`; resolves with how its first write went (withdrawn when it failed, if so). */
  #recordFirst(tenant: string, event: AuditEventInput, withdrawOnFailure: boolean) {
    return new Promise<boolean>((resolve) => {
      const done = (): void => undefined;
      this.#enqueue(tenant, { ...identified(event), withdrawOnFailure, first: resolve, done });
    });
  }

  /**
   * What `tenant`'s `call.admitted` records of a call's arguments besides their digest, as the
   * tenant chose: nothing (the default), or the arguments in full or redacted.
   */
  argumentsOf(
    tenant: string,
    args: Record<string, unknown>,
  ): { arguments?: Record<string, unknown> } {
    const recording = this.#options.argumentsRecording?.get(tenant);
    return recording === undefined ? {} : recordedArguments(args, recording);
  }

  /** `unavailable` when `tenant`'s trail cannot be written now and admissions must be recorded. */
  refusal(tenant: string): ToolmeshError | undefined {
    if (!this.required) return undefined;
    const chain = this.#chains.get(tenant);
    if (chain?.failing !== true) return undefined;
    return new ToolmeshError(
      ErrorCode.Unavailable,
      `the audit trail of tenant ${tenant} cannot be written now; calls are refused until it can (TOOLMESH_AUDIT=required)`,
      { retryable: true, details: { tenant } },
    );
  }

  /** Events recorded but not written yet, over every tenant. */
  get pending(): number {
    let n = 0;
    for (const chain of this.#chains.values()) n += chain.queue.length;
    return n;
  }

  /** Stops retrying; events not written by then stay unwritten (logged by the caller). */
  stop(): void {
    this.#stop.abort();
  }

  /**
   * Waits until every event recorded so far is written, at most `timeoutMs`, then stops
   * retrying: what a service does when it shuts down, before it closes its connection.
   * Resolves with how many events are left unwritten (lost).
   */
  async settle(timeoutMs: number): Promise<number> {
    if (this.pending > 0) {
      const idle = new Promise<void>((resolve) => this.#idle.push(resolve));
      await Promise.race([idle, sleep(timeoutMs, undefined, { ref: false })]);
    }
    this.stop();
    return this.pending;
  }

  #enqueue(tenant: string, pending: Pending): void {
    let chain = this.#chains.get(tenant);
    if (chain === undefined) {
      const { subjects } = this.#options;
      chain = new TenantChain(tenant, subjects.auditStream(tenant), subjects.audit(tenant));
      this.#chains.set(tenant, chain);
    }
    chain.queue.push(pending);
    void this.#pump(chain);
  }

  async #pump(chain: TenantChain): Promise<void> {
    if (chain.pumping) return;
    chain.pumping = true;
    let pause = this.#options.retryMinMs ?? 100;
    try {
      while (chain.queue.length > 0 && !this.#stop.signal.aborted) {
        const batch = chain.queue.slice(0, this.#options.batchMax ?? 256);
        const { written, failure } = await this.#writeBatch(chain, batch);
        for (const done of chain.queue.splice(0, written)) {
          done.first?.(true);
          done.done();
        }
        this.#wakeIfIdle();
        if (written > 0) {
          pause = this.#options.retryMinMs ?? 100;
          this.#healthy(chain, true);
        }
        if (failure === undefined || failure === "raced") continue;
        this.#options.observer?.auditWriteFailed();
        this.#healthy(chain, false, failure.err);
        const noneKept = this.#settleFailed(chain, batch.slice(written));
        this.#wakeIfIdle();
        if (noneKept) continue;
        await sleep(pause, undefined, { signal: this.#stop.signal, ref: false }).catch(
          () => undefined,
        );
        pause = Math.min(pause * 2, this.#options.retryMaxMs ?? 5_000);
      }
    } finally {
      chain.pumping = false;
    }
  }

  /** Resolves the waits of {@link settle} once no event is left to write. */
  #wakeIfIdle(): void {
    if (this.#idle.length > 0 && this.pending === 0)
      for (const resolve of this.#idle.splice(0)) resolve();
  }

  /**
   * Settles events whose first write failed: withdraws those recorded to be withdrawn, keeps the
   * others to retry. True when none is kept (the queue goes on without a pause).
   */
  #settleFailed(chain: TenantChain, failed: readonly Pending[]): boolean {
    let kept = 0;
    for (const pending of failed) {
      pending.first?.(false);
      pending.first = undefined;
      if (!pending.withdrawOnFailure) {
        kept++;
        continue;
      }
      const at = chain.queue.indexOf(pending);
      if (at >= 0) chain.queue.splice(at, 1);
    }
    return kept === 0;
  }

  #healthy(chain: TenantChain, healthy: boolean, err?: unknown): void {
    if (chain.failing === !healthy) return;
    chain.failing = !healthy;
    this.#options.onHealth?.(chain.tenant, healthy, err);
  }

  /**
   * One attempt to append `batch` after the chain's tail: the batch is sealed as one run of the
   * chain and published back to back, each event expecting the sequence and (after the first)
   * the message id of the one before it, and the acks are awaited together. Because of that
   * expectation an event lands only right after its predecessor, so the written events are the
   * run up to the last one acknowledged; the rest is written again after the tail is read anew.
   */
  async #writeBatch(chain: TenantChain, batch: readonly Pending[]): Promise<BatchOutcome> {
    let tail: ChainTail;
    try {
      tail = chain.tail ??= await readTail(this.#jsm, chain.stream, chain.subject);
    } catch (err) {
      return { written: 0, failure: { err } };
    }
    // Earlier attempts whose answers were lost may have landed: the tail is then the last of
    // them, exactly as this process sealed it (its id alone could be a step recorded before).
    const landed = tail.hash === null ? -1 : batch.findIndex((p) => p.sealed === tail.hash);
    if (landed >= 0) return { written: landed + 1 };
    const records: AuditRecord[] = [];
    const acks = batch.map((pending, i) => {
      const record = sealRecord(
        { v: 1, id: pending.id, tenant: chain.tenant, by: this.#options.writer, ...pending.event },
        tail,
      );
      const expect = { lastSequence: tail.seq, streamName: chain.stream };
      // The server ignores an expected last sequence of 0; the stream's one subject's last
      // sequence is checked even when 0, so the first event of an empty trail is single too.
      const after =
        i === 0
          ? { lastSubjectSequence: tail.hash === null ? 0 : tail.seq }
          : { lastMsgID: tail.id };
      records.push(record);
      pending.sealed = record.hash;
      tail = { seq: record.seq, hash: record.hash, id: record.id };
      return this.#js.publish(chain.subject, JSON.stringify(record), {
        msgID: pending.id,
        expect: { ...expect, ...after },
      });
    });
    const settled = await Promise.allSettled(acks);
    return this.#afterBatch(chain, records, settled);
  }

  /** What a batch's acks say: how many of its events are written, and why the rest is not. */
  #afterBatch(
    chain: TenantChain,
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
      if (!duplicate) this.#options.observer?.auditWritten(record.type, Date.now() - record.at);
    });
    const last = records[written - 1];
    // A duplicate landed in an earlier attempt, somewhere before: the tail is read anew.
    chain.tail =
      last === undefined || duplicate ? undefined : { seq: last.seq, hash: last.hash, id: last.id };
    const first = settled[written];
    if (first === undefined || first.status === "fulfilled") return { written };
    chain.tail = undefined;
    return { written, failure: isChainRace(first.reason) ? "raced" : { err: first.reason } };
  }
}

/**
 * What a service's shutdown does with its trail, before its connection closes: waits up to
 * `withinMs` for the events recorded to be written, and logs those that are not (lost).
 */
export async function settleAudit(
  audit: Pick<AuditTrail, "settle">,
  withinMs: number,
  log: { warn(obj: object, msg: string): void },
): Promise<void> {
  const unwritten = await audit.settle(withinMs);
  if (unwritten > 0)
    log.warn({ unwritten }, "audit events not written by the end of the shutdown; they are lost");
}

/** An event and its id: the step's own, or a fresh one. */
function identified({ id, ...event }: AuditEventInput): Pick<Pending, "event" | "id"> {
  return { event, id: id ?? randomUUID() };
}

/** How one batch went: its first `written` events are in the stream. */
interface BatchOutcome {
  written: number;
  /** Why the next one is not: another writer moved the tail, or the write failed. */
  failure?: "raced" | { err: unknown } | undefined;
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
