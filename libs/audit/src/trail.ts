import { randomUUID } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import type { NatsConnection } from "@nats-io/nats-core";
import type { JetStreamClient, JetStreamManager } from "@nats-io/jetstream";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import type { Subjects } from "@toolmesh/protocol";
import { ErrorCode, ToolmeshError } from "@toolmesh/protocol";
import { isWrongLastSequence } from "@toolmesh/nats";
import type { ChainTail } from "./chain.js";
import { sealRecord } from "./chain.js";
import type { AuditEventInput, AuditRecord } from "./events.js";

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
}

interface Pending {
  event: AuditEventInput;
  id: string;
  /** Settled after the first attempt: whether the event was written. */
  first?: ((written: boolean) => void) | undefined;
  /** Withdrawn instead of retried when its first attempt fails. */
  withdrawOnFailure: boolean;
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
      this.#enqueue(tenant, { event, id: randomUUID(), withdrawOnFailure: false, done: resolve });
    });
  }

  /**
   * Records `event` if its first write passes: true when written, false when that write failed
   * and the event was withdrawn (the fact it records must then not happen, e.g. an admission
   * in `required` mode). Events recorded before it are written first.
   */
  tryRecord(tenant: string, event: AuditEventInput): Promise<boolean> {
    return new Promise((resolve) => {
      this.#enqueue(tenant, {
        event,
        id: randomUUID(),
        withdrawOnFailure: true,
        first: resolve,
        done: () => undefined,
      });
    });
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
        const head = chain.queue[0] as Pending;
        const outcome = await this.#write(chain, head);
        if (outcome === "raced") continue;
        if (outcome === "written") {
          chain.queue.shift();
          pause = this.#options.retryMinMs ?? 100;
          this.#healthy(chain, true);
          head.first?.(true);
          head.done();
          continue;
        }
        this.#options.observer?.auditWriteFailed();
        this.#healthy(chain, false, outcome.err);
        if (head.withdrawOnFailure) {
          chain.queue.shift();
          head.first?.(false);
          continue;
        }
        head.first?.(false);
        head.first = undefined;
        await sleep(pause, undefined, { signal: this.#stop.signal, ref: false }).catch(
          () => undefined,
        );
        pause = Math.min(pause * 2, this.#options.retryMaxMs ?? 5_000);
      }
    } finally {
      chain.pumping = false;
    }
  }

  #healthy(chain: TenantChain, healthy: boolean, err?: unknown): void {
    if (chain.failing === !healthy) return;
    chain.failing = !healthy;
    this.#options.onHealth?.(chain.tenant, healthy, err);
  }

  /** One attempt to append `head` after the chain's tail. */
  async #write(chain: TenantChain, head: Pending): Promise<"written" | "raced" | { err: unknown }> {
    try {
      chain.tail ??= await readTail(this.#jsm, chain.stream);
      if (chain.tail.id === head.id) return "written"; // an earlier attempt landed
      const record = sealRecord(
        { v: 1, id: head.id, tenant: chain.tenant, by: this.#options.writer, ...head.event },
        chain.tail,
      );
      const ack = await this.#js.publish(chain.subject, JSON.stringify(record), {
        msgID: head.id,
        expect: { lastSequence: chain.tail.seq, streamName: chain.stream },
      });
      if (ack.duplicate) {
        // An earlier attempt landed (its answer was lost): its place is in the stream.
        chain.tail = undefined;
        return "written";
      }
      chain.tail = { seq: record.seq, hash: record.hash, id: record.id };
      this.#options.observer?.auditWritten(record.type, Date.now() - record.at);
      return "written";
    } catch (err) {
      chain.tail = undefined;
      if (isWrongLastSequence(err)) return "raced";
      return { err };
    }
  }
}

/** The last event of a tenant's audit stream (sequence 0, no hash when it is empty). */
export async function readTail(jsm: JetStreamManager, stream: string): Promise<ChainTail> {
  const info = await jsm.streams.info(stream);
  const last = info.state.last_seq;
  if (last === 0 || info.state.messages === 0) return { seq: last, hash: null };
  const msg = await jsm.streams.getMessage(stream, { seq: last });
  const record = msg?.json<AuditRecord>();
  return { seq: last, hash: record?.hash ?? null, id: record?.id };
}
