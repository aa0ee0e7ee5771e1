import { randomUUID } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import type { NatsConnection } from "@nats-io/nats-core";
import type { Subjects } from "@toolmesh/protocol";
import { ErrorCode, ToolmeshError } from "@toolmesh/protocol";
import { followStatus } from "@toolmesh/nats";
import { ChainWriter } from "./chain-writer.js";
import type { AuditEventInput } from "./events.js";
import { ForwardingWriter } from "./forward.js";
import type { ArgumentsRecording } from "./record.js";
import { recordedArguments } from "./record.js";
import type { BatchWriter, QueuedEvent } from "./writer.js";

/** `required`: a call whose admission cannot be recorded is refused; `best-effort`: it runs. */
export type AuditMode = "required" | "best-effort";

/** What the trail reports to metrics and logs; telemetry never throws into it. */
export interface AuditTrailObserver {
  auditWritten(type: string, lagMs: number): void;
  auditWriteFailed(): void;
  auditDropped(): void;
}

/** Most events a tenant whose writes fail keeps queued in one process; what comes past it is dropped. */
const QUEUE_MAX = 10_000;

/** Options of {@link AuditTrail}. Durations in ms. */
export interface AuditTrailOptions {
  subjects: Subjects;
  mode: AuditMode;
  /** Names the writing process in each event (`resolver@host/pid`). */
  writer: string;
  /**
   * Whether this process appends to the chains itself (the resolvers), or hands its events to
   * the resolvers, which do (every other service; ADR 0064).
   */
  chains: boolean;
  observer?: AuditTrailObserver | undefined;
  /** Called once per failing tenant when writes start failing, and when they pass again. */
  onHealth?: ((tenant: string, healthy: boolean, err?: unknown) => void) | undefined;
  /**
   * Called once per failing tenant when its queue is full and its further events are dropped
   * (until its writes pass again).
   */
  onDropping?: ((tenant: string, queued: number) => void) | undefined;
  /** Most events a failing tenant keeps queued. Default 10 000. */
  queueMax?: number | undefined;
  /**
   * First and longest pause between retries of a failed write. Default 100, and 5 000 where
   * this process chains (1 000 where it hands events on: a retry while no resolver runs costs
   * nothing, and a step waiting for a resolver learns of its return within a second).
   */
  retryMinMs?: number | undefined;
  retryMaxMs?: number | undefined;
  /** How each tenant's arguments are recorded (by tenant token); a tenant not named: digest. */
  argumentsRecording?: ReadonlyMap<string, ArgumentsRecording> | undefined;
  /** Most events published in one run before their acks are awaited. Default 256. */
  batchMax?: number | undefined;
}

interface Pending extends QueuedEvent {
  /**
   * Settled after the first attempt that was answered (or when the trail stops): whether the
   * event was written.
   */
  first?: ((written: boolean) => void) | undefined;
  /** Steps waiting for this event's first write to be done, whatever its outcome ({@link AuditTrail.written}). */
  after?: (() => void)[] | undefined;
  /** Withdrawn instead of retried when its first attempt fails. */
  withdrawOnFailure: boolean;
  done: () => void;
}

/** Tells the steps waiting for an event's first write how it went (once). */
function firstDone(pending: Pending, written: boolean): void {
  pending.first?.(written);
  pending.first = undefined;
  for (const resolve of pending.after?.splice(0) ?? []) resolve();
}

/** One tenant's events as this process writes them. */
class TenantQueue {
  readonly queue: Pending[] = [];
  failing = false;
  dropping = false;
  pumping = false;
  constructor(readonly tenant: string) {}
}

/**
 * Records audit events into their tenant's audit stream (ADR 0060), one chain per tenant,
 * through its {@link BatchWriter}: appended by this process or handed to the resolvers (ADR
 * 0064). Events of a tenant are written in the order they were recorded; a failed write is
 * retried with backoff until it passes, never dropped. Tenants are named by their subject
 * token (`SessionAddress.tenant`).
 */
export class AuditTrail {
  readonly #writer: BatchWriter;
  readonly #options: AuditTrailOptions;
  readonly #chains = new Map<string, TenantQueue>();
  readonly #stop = new AbortController();
  // Cuts the pauses between retries short: a process settling tries what it holds at once.
  #hurry = new AbortController();
  // Waiting for every event recorded to be written (settle).
  #idle: (() => void)[] = [];

  private constructor(writer: BatchWriter, options: AuditTrailOptions) {
    this.#writer = writer;
    this.#options = options;
  }

  /** Opens a trail on the mesh account's connection. */
  static async open(nc: NatsConnection, options: AuditTrailOptions): Promise<AuditTrail> {
    const { subjects, observer } = options;
    const writer = options.chains
      ? await ChainWriter.open(nc, subjects, (type, lag) => observer?.auditWritten(type, lag))
      : new ForwardingWriter(nc, subjects);
    const trail = new AuditTrail(writer, {
      ...options,
      retryMaxMs: options.retryMaxMs ?? (options.chains ? 5_000 : 1_000),
    });
    trail.#retryOnReconnect(nc);
    return trail;
  }

  /** A write that failed because the connection was down is tried again as soon as it is back. */
  #retryOnReconnect(nc: NatsConnection): void {
    const stopFollowing = followStatus(nc, { reconnect: () => this.#retryNow() });
    this.#stop.signal.addEventListener("abort", stopFollowing, { once: true });
  }

  /** Cuts every pause between retries short. */
  #retryNow(): void {
    this.#hurry.abort();
    this.#hurry = new AbortController();
  }

  /** The name of this process in the events it records (`by`). */
  get writer(): string {
    return this.#options.writer;
  }

  /**
   * Resolves once every event recorded for `tenant` so far has had its first write, written or
   * not: what a step waits for before it publishes what another process records after them, so
   * that the chain keeps their order. At once while the tenant's writes fail (no resolver
   * taking what is handed on counts): its events wait for their retries, and the step does not.
   */
  written(tenant: string): Promise<void> {
    const chain = this.#chains.get(tenant);
    const last = chain?.queue.at(-1);
    if (last === undefined || chain?.failing === true) return Promise.resolve();
    return new Promise((resolve) => (last.after ??= []).push(resolve));
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
      this.#enqueue(tenant, this.#pending(event, false, resolve));
    });
  }

  /**
   * Records `event` and resolves once it is written (true), or once a write of it failed for a
   * reason of the tenant's own (false; the event is kept and retried, as {@link record}'s are).
   * While no resolver takes the events handed on, it waits for one: a step that goes on
   * without its record would take the record with it if killed (callers bound the wait).
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
      this.#enqueue(
        tenant,
        this.#pending(event, withdrawOnFailure, () => undefined, resolve),
      );
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

  /**
   * Stops retrying; events not written by then stay unwritten (logged by the caller), and steps
   * still waiting for a first write are told it failed.
   */
  stop(): void {
    this.#stop.abort();
    for (const chain of this.#chains.values())
      for (const pending of chain.queue) firstDone(pending, false);
  }

  /**
   * Waits until every event recorded so far is written, at most `timeoutMs`, then stops
   * retrying: what a service does when it shuts down, before it closes its connection.
   * Resolves with how many events are left unwritten (lost).
   */
  async settle(timeoutMs: number): Promise<number> {
    this.#retryNow();
    if (this.pending > 0) {
      const idle = new Promise<void>((resolve) => this.#idle.push(resolve));
      await Promise.race([idle, sleep(timeoutMs, undefined, { ref: false })]);
    }
    this.stop();
    return this.pending;
  }

  #enqueue(tenant: string, pending: Pending): void {
    if (this.#stop.signal.aborted) {
      // Stopped: nothing more is written. A step waiting for the first write hears so now;
      // one to withdraw is not kept (the service that handed it on still holds it).
      firstDone(pending, false);
      if (pending.withdrawOnFailure) return;
    }
    let chain = this.#chains.get(tenant);
    if (chain === undefined) {
      chain = new TenantQueue(tenant);
      this.#chains.set(tenant, chain);
    }
    if (this.#full(chain)) {
      // A step that waits for its write is told it failed; one that must not be refused
      // goes on, its event dropped: the process's memory is not the tenant's to fill.
      firstDone(pending, false);
      if (!pending.withdrawOnFailure) pending.done();
      return;
    }
    chain.queue.push(pending);
    void this.#pump(chain);
  }

  async #pump(chain: TenantQueue): Promise<void> {
    if (chain.pumping) return;
    chain.pumping = true;
    let pause = this.#options.retryMinMs ?? 100;
    try {
      while (chain.queue.length > 0 && !this.#stop.signal.aborted) {
        const batch = chain.queue.slice(0, this.#options.batchMax ?? 256);
        const { written, failure } = await this.#writer.write(chain.tenant, batch);
        for (const done of chain.queue.splice(0, written)) {
          firstDone(done, true);
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
        const noneKept = this.#settleFailed(chain, batch.slice(written), failure.unanswered);
        this.#wakeIfIdle();
        if (noneKept) continue;
        const signal = AbortSignal.any([this.#stop.signal, this.#hurry.signal]);
        await sleep(pause, undefined, { signal, ref: false }).catch(() => undefined);
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
   * Settles events whose write failed: withdraws those recorded to be withdrawn, keeps the
   * others to retry. Steps waiting for a first write are told it failed, unless no resolver
   * answered (`unanswered`): those wait for a later attempt. True when none is kept (the queue
   * goes on without a pause).
   */
  #settleFailed(chain: TenantQueue, failed: readonly Pending[], unanswered = false): boolean {
    let kept = 0;
    for (const pending of failed) {
      if (pending.withdrawOnFailure || !unanswered) firstDone(pending, false);
      if (!pending.withdrawOnFailure) {
        kept++;
        continue;
      }
      const at = chain.queue.indexOf(pending);
      if (at >= 0) chain.queue.splice(at, 1);
    }
    return kept === 0;
  }

  /**
   * Whether `chain` takes no more events: its writes fail and it holds `queueMax` (a tenant
   * with no audit stream, or one that stays full, gets calls refused while its events wait;
   * those past the bound are dropped, counted and said once).
   */
  #full(chain: TenantQueue): boolean {
    const max = this.#options.queueMax ?? QUEUE_MAX;
    if (!chain.failing || chain.queue.length < max) return false;
    this.#options.observer?.auditDropped();
    if (!chain.dropping) {
      chain.dropping = true;
      this.#options.onDropping?.(chain.tenant, chain.queue.length);
    }
    return true;
  }

  #healthy(chain: TenantQueue, healthy: boolean, err?: unknown): void {
    if (chain.failing === !healthy) return;
    chain.failing = !healthy;
    if (healthy) chain.dropping = false;
    this.#options.onHealth?.(chain.tenant, healthy, err);
  }

  /**
   * An event to queue, with its id (the step's own, or a fresh one) and the process that did it.
   * Built field by field: a spread followed by more fields takes V8's slow path, and this is on
   * every call's path.
   */
  #pending(
    { id, by, ...event }: AuditEventInput,
    withdrawOnFailure: boolean,
    done: () => void,
    first?: (written: boolean) => void,
  ): Pending {
    return {
      event,
      id: id ?? randomUUID(),
      by: by ?? this.#options.writer,
      withdrawOnFailure,
      done,
      first,
    };
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
