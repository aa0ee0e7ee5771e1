import type { NatsConnection, QueuedIterator } from "@nats-io/nats-core";
import type { KV, KvWatchEntry } from "@nats-io/kv";
import { Kvm } from "@nats-io/kv";
import type { Quota, Subjects } from "@toolmesh/protocol";
import { ErrorCode, ToolmeshError, decodeJson, subjectToken } from "@toolmesh/protocol";
import { modifyKvEntry, warnUnavailable, watchLoaded } from "@toolmesh/nats";
import type { Logger } from "@toolmesh/telemetry";
import type { ScopedQuota } from "@toolmesh/catalog";
import type { Usage, UsageEntry } from "@toolmesh/catalog/internal";
import {
  decodeStoredQuota,
  decodeUsage,
  emptyUsage,
  openQuotaBucket,
  quotaBucketSpecs,
  utcDay,
} from "@toolmesh/catalog/internal";

// Quotas are data in the mesh (the catalog's QuotaStore reads and writes them); here every
// resolver watches them and counts calls against them by compare-and-set.

// ---------------------------------------------------------------------------------------------
// The watched view: every resolver holds every quota in memory.

/** Every quota, kept current by a KV watch; lookups are map reads. */
export class QuotaView {
  readonly #byKey = new Map<string, ScopedQuota>();
  // Tenant token → how many of its scopes have a quota: the hot path's only question for a
  // tenant without one.
  readonly #tenants = new Map<string, number>();
  #watcher: QueuedIterator<KvWatchEntry> | undefined;
  readonly #changes = new Set<(key: string) => void>();

  /** Loads every quota and keeps watching the bucket. */
  /** `bucket` names `kv` in the warnings. */
  static async open(kv: KV, bucket: string, log: Logger): Promise<QuotaView> {
    const view = new QuotaView();
    const apply = (entry: KvWatchEntry): void => {
      try {
        view.#apply(entry);
      } catch (err) {
        log.warn({ key: entry.key, err }, "ignoring a quota that cannot be read");
      }
    };
    view.#watcher = await watchLoaded(kv, apply, {
      what: "load the quotas",
      onRetry: warnUnavailable(log, bucket, "bucket"),
    });
    return view;
  }

  /** Whether the tenant (token) has any quota. */
  hasTenant(tenant: string): boolean {
    return this.#tenants.has(tenant);
  }

  /** The quota under a key. */
  get(key: string): ScopedQuota | undefined {
    return this.#byKey.get(key);
  }

  /** Every quota. */
  all(): IterableIterator<ScopedQuota> {
    return this.#byKey.values();
  }

  /** The keys of the scopes a call of this tenant, tool and agent pays into, tenant first. */
  scopesOf(tenant: string, tool: string, agent: string | undefined): string[] {
    if (!this.#tenants.has(tenant)) return [];
    const keys = [tenant, `${tenant}.tool.${subjectToken(tool)}`];
    if (agent !== undefined && agent.length > 0)
      keys.push(`${tenant}.agent.${subjectToken(agent)}`);
    return keys.filter((k) => this.#byKey.has(k));
  }

  /** Tells `listener` the key of every quota that changes; returns the way to stop. */
  onChange(listener: (key: string) => void): () => void {
    this.#changes.add(listener);
    return () => this.#changes.delete(listener);
  }

  /** Stops watching. */
  close(): void {
    this.#watcher?.stop();
  }

  #apply(entry: KvWatchEntry): void {
    const tenant = entry.key.split(".")[0] ?? entry.key;
    const had = this.#byKey.has(entry.key);
    if (entry.operation !== "PUT") {
      if (had) {
        this.#byKey.delete(entry.key);
        const left = (this.#tenants.get(tenant) ?? 1) - 1;
        if (left <= 0) this.#tenants.delete(tenant);
        else this.#tenants.set(tenant, left);
      }
    } else {
      const stored = decodeStoredQuota(entry.value);
      this.#byKey.set(entry.key, { key: entry.key, ...stored });
      if (!had) this.#tenants.set(tenant, (this.#tenants.get(tenant) ?? 0) + 1);
    }
    for (const listener of this.#changes) listener(entry.key);
  }
}

function msToNextUtcDay(ms: number): number {
  const next = new Date(ms);
  next.setUTCHours(24, 0, 0, 0);
  return next.getTime() - ms;
}

/** A call as the gate counts it. */
export interface CountedCall {
  /** Its call key (`callKey(address, idempotency_key)`). */
  key: string;
  /** Its deadline, ms on the server clock. */
  deadline_at: number;
}

/** Why a quota refused a call. */
export type QuotaName = "max_in_flight" | "max_queued" | "rate" | "daily";

/** How long a counted call may lack a record before reconciliation forgets it, in ms. */
const UNRECORDED_GRACE_MS = 60_000;
/** How long after its deadline a counted call is forgotten whatever its record says, in ms. */
const DEADLINE_GRACE_MS = 5_000;
/** What a concurrency refusal suggests waiting, in ms. */
const CONCURRENCY_RETRY_MS = 1_000;

/** Options of {@link QuotaGate.open}. */
export interface QuotaGateOptions {
  subjects: Subjects;
  log: Logger;
  replicas?: number;
  /** How often counts of calls that ended unseen are reconciled, in ms; 0 = never. Default 5 000. */
  reconcileMs?: number;
  /** The time, ms (the server clock). Default `Date.now`. */
  now?: () => number;
}

/**
 * Admits calls against the quotas of their scopes and counts them out when they end. Every
 * change is a compare-and-set on the scope's usage entry, so resolvers running side by side
 * never admit past a limit; a call is counted by its key, so a redelivered call is not counted
 * twice. Calls this process counted are counted out when their final message goes by
 * ({@link QuotaGate.ended}); calls whose end no process saw (a resolver that died) are
 * reconciled from their records and deadlines.
 */
export class QuotaGate {
  readonly view: QuotaView;
  readonly #usage: KV;
  readonly #calls: KV;
  readonly #log: Logger;
  readonly #now: () => number;
  // `{tenant}.{session}.{call token}` → what to count out when its final message goes by.
  readonly #counted = new Map<string, { key: string; scopes: string[] }>();
  #reconciler: NodeJS.Timeout | undefined;

  private constructor(view: QuotaView, usage: KV, calls: KV, options: QuotaGateOptions) {
    this.view = view;
    this.#usage = usage;
    this.#calls = calls;
    this.#log = options.log;
    this.#now = options.now ?? Date.now;
  }

  /** Opens the buckets, loads the quotas and starts reconciling. */
  static async open(nc: NatsConnection, options: QuotaGateOptions): Promise<QuotaGate> {
    const specs = quotaBucketSpecs(options.subjects, options.replicas);
    const quotas = await openQuotaBucket(nc, specs.quotas);
    const usage = await openQuotaBucket(nc, specs.quotaUsage);
    const calls = await new Kvm(nc).open(options.subjects.callsBucket, { allow_direct: false });
    const view = await QuotaView.open(quotas, options.subjects.quotasBucket, options.log);
    const gate = new QuotaGate(view, usage, calls, options);
    const every = options.reconcileMs ?? 5_000;
    if (every > 0) {
      const tick = (): void => {
        gate
          .reconcile()
          .catch((err: unknown) => options.log.warn({ err }, "cannot reconcile quota usage"))
          .finally(() => {
            if (gate.#reconciler !== undefined) gate.#reconciler = setTimeout(tick, every).unref();
          });
      };
      gate.#reconciler = setTimeout(tick, every).unref();
    }
    return gate;
  }

  /** How many calls this process counted and has not seen end. */
  get counted(): number {
    return this.#counted.size;
  }

  /** Calls this process counted and has not seen end, per tenant token. */
  countedByTenant(): Map<string, number> {
    const byTenant = new Map<string, number>();
    for (const id of this.#counted.keys()) {
      const tenant = id.slice(0, id.indexOf("."));
      byTenant.set(tenant, (byTenant.get(tenant) ?? 0) + 1);
    }
    return byTenant;
  }

  /**
   * Counts a call into every scope it pays into, or refuses it with the first limit it meets
   * (and counts it into none). A call counted already passes again. `queued` marks it as waiting
   * for its fair turn (limited by `max_queued`). `at` is the session address and call token of
   * its final message, by which it is counted out.
   */
  async admit(
    call: CountedCall,
    at: { tenant: string; session: string; callToken: string },
    scopes: string[],
    queued = false,
  ): Promise<ToolmeshError | undefined> {
    if (scopes.length === 0) return undefined;
    const charged: string[] = [];
    for (const key of scopes) {
      const quota = this.view.get(key)?.quota;
      if (quota === undefined) continue;
      const refusal = await this.#charge(key, quota, call, queued);
      if (refusal !== undefined) {
        await this.#refund(charged, call.key);
        return refusal;
      }
      charged.push(key);
    }
    this.#counted.set(`${at.tenant}.${at.session}.${at.callToken}`, { key: call.key, scopes });
    return undefined;
  }

  /** Marks a counted call as no longer queued (handed to its executors). */
  async dequeued(call: CountedCall, scopes: string[]): Promise<void> {
    for (const key of scopes) {
      await this.#modify(key, (usage) => {
        const entry = usage.in_flight[call.key];
        if (entry?.q === undefined) return false;
        delete entry.q;
        return true;
      });
    }
  }

  /**
   * Counts out the call a final message was published for, if this process counted it (its
   * session address and call token, as read from the result subject). Never throws.
   */
  ended(tenant: string, session: string, callToken: string): void {
    if (!this.view.hasTenant(tenant) && this.#counted.size === 0) return;
    const id = `${tenant}.${session}.${callToken}`;
    const counted = this.#counted.get(id);
    if (counted === undefined) return;
    this.#counted.delete(id);
    this.release(counted.key, counted.scopes).catch((err: unknown) =>
      this.#log.warn({ err, key: counted.key }, "cannot count a call out; reconciliation will"),
    );
  }

  /** Counts a call out of its scopes. */
  async release(callKey: string, scopes: string[]): Promise<void> {
    for (const key of scopes) {
      await this.#modify(key, (usage) => {
        if (usage.in_flight[callKey] === undefined) return false;
        delete usage.in_flight[callKey];
        return true;
      });
    }
  }

  /**
   * Forgets counted calls that ended unseen: past their deadline (the deadline keeper ended
   * them), ended according to their record, or without a record long after being counted (a
   * resolver died between counting and accepting, and the call never came back).
   */
  async reconcile(): Promise<number> {
    let forgotten = 0;
    const now = this.#now();
    for (const { key } of [...this.view.all()]) {
      const entry = await this.#usage.get(key);
      if (entry?.operation !== "PUT") continue;
      const usage = decodeUsage(entry.value);
      const stale: string[] = [];
      for (const [callKey, counted] of Object.entries(usage.in_flight)) {
        if (counted.d + DEADLINE_GRACE_MS < now) stale.push(callKey);
        else if (await this.#ended(callKey, counted, now)) stale.push(callKey);
      }
      if (stale.length === 0) continue;
      await this.#modify(key, (current) => {
        let changed = false;
        for (const callKey of stale) {
          if (current.in_flight[callKey] !== undefined) {
            delete current.in_flight[callKey];
            changed = true;
          }
        }
        return changed;
      });
      forgotten += stale.length;
      this.#log.info({ scope: key, calls: stale.length }, "reconciled calls that ended unseen");
    }
    return forgotten;
  }

  /** Stops reconciling and watching. */
  close(): void {
    clearTimeout(this.#reconciler);
    this.#reconciler = undefined;
    this.view.close();
  }

  async #ended(callKey: string, counted: UsageEntry, now: number): Promise<boolean> {
    const entry = await this.#calls.get(callKey);
    if (entry?.operation !== "PUT") return counted.t + UNRECORDED_GRACE_MS < now;
    const record = decodeJson(entry.value) as { state?: unknown } | null;
    return record?.state === "done";
  }

  async #charge(
    key: string,
    quota: Quota,
    call: CountedCall,
    queued: boolean,
  ): Promise<ToolmeshError | undefined> {
    let refusal: ToolmeshError | undefined;
    await this.#modify(key, (usage) => {
      refusal = undefined;
      const now = this.#now();
      const known = usage.in_flight[call.key];
      if (known !== undefined) {
        // Counted before (a redelivery): only whether it waits may change.
        const wasQueued = known.q === 1;
        if (wasQueued === queued) return false;
        if (queued) known.q = 1;
        else delete known.q;
        return true;
      }
      const entries = Object.values(usage.in_flight);
      const today = utcDay(now);
      const count = usage.day === today ? (usage.count ?? 0) : 0;
      if (quota.daily !== undefined && count >= quota.daily) {
        refusal = refused(key, "daily", quota.daily, {
          retryable: false,
          retryAfterMs: msToNextUtcDay(now),
        });
        return false;
      }
      let tokens: number | undefined;
      if (quota.rate !== undefined) {
        const burst = quota.burst ?? Math.max(1, Math.ceil(quota.rate));
        const last = usage.at ?? now;
        const refilled = (usage.tokens ?? burst) + (Math.max(0, now - last) * quota.rate) / 1_000;
        tokens = Math.min(burst, refilled);
        if (tokens < 1) {
          refusal = new ToolmeshError(
            ErrorCode.RateLimited,
            `quota ${key} allows ${quota.rate} calls per second (burst ${burst})`,
            {
              details: {
                scope: key,
                quota: "rate",
                limit: quota.rate,
                burst,
                retry_after_ms: Math.ceil(((1 - tokens) * 1_000) / quota.rate),
              },
            },
          );
          return false;
        }
      }
      if (quota.max_in_flight !== undefined && entries.length >= quota.max_in_flight) {
        refusal = refused(key, "max_in_flight", quota.max_in_flight, { retryable: true });
        return false;
      }
      if (queued && quota.max_queued !== undefined) {
        const waiting = entries.filter((e) => e.q === 1).length;
        if (waiting >= quota.max_queued) {
          refusal = refused(key, "max_queued", quota.max_queued, { retryable: true });
          return false;
        }
      }
      usage.in_flight[call.key] = { d: call.deadline_at, t: now, ...(queued ? { q: 1 } : {}) };
      if (tokens !== undefined) {
        usage.tokens = tokens - 1;
        usage.at = now;
      }
      usage.day = today;
      usage.count = count + 1;
      return true;
    });
    return refusal;
  }

  async #refund(keys: string[], callKey: string): Promise<void> {
    for (const key of keys) {
      await this.#modify(key, (usage) => {
        if (usage.in_flight[callKey] === undefined) return false;
        delete usage.in_flight[callKey];
        if (usage.tokens !== undefined) usage.tokens += 1;
        if (usage.count !== undefined && usage.count > 0) usage.count -= 1;
        return true;
      });
    }
  }

  /**
   * Reads a scope's usage, lets `change` edit it (false: nothing to write) and writes it back
   * only if nobody wrote in between; otherwise reads again.
   */
  async #modify(key: string, change: (usage: Usage) => boolean): Promise<void> {
    await modifyKvEntry(
      this.#usage,
      key,
      (value) => (value === undefined ? emptyUsage() : decodeUsage(value)),
      change,
    );
  }
}

function refused(
  key: string,
  quota: QuotaName,
  limit: number,
  options: { retryable: boolean; retryAfterMs?: number },
): ToolmeshError {
  const what =
    quota === "daily"
      ? `${limit} calls per UTC day`
      : quota === "max_queued"
        ? `${limit} calls waiting`
        : `${limit} calls in flight`;
  return new ToolmeshError(ErrorCode.QuotaExceeded, `quota ${key} allows ${what}`, {
    retryable: options.retryable,
    details: {
      scope: key,
      quota,
      limit,
      retry_after_ms: options.retryAfterMs ?? CONCURRENCY_RETRY_MS,
    },
  });
}
