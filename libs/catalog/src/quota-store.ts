import type { NatsConnection } from "@nats-io/nats-core";
import type { JetStreamManager } from "@nats-io/jetstream";
import { jetstreamManager } from "@nats-io/jetstream";
import type { KV } from "@nats-io/kv";
import type { Quota, QuotaScope, Subjects } from "@toolmesh/protocol";
import {
  ErrorCode,
  ToolmeshError,
  decodeJson,
  encodeJson,
  parseQuota,
  quotaKey,
  subjectToken,
} from "@toolmesh/protocol";
import type { StreamSpec } from "@toolmesh/nats";
import { isWrongLastSequence, meshPlan, openBucket, scanBucket } from "@toolmesh/nats";

// Quotas are data in the mesh: limits in the bucket `{p}_quotas` (watched by every resolver),
// what each scope uses in `{p}_quota_usage`, changed only by compare-and-set so that any number
// of resolvers together never let a scope past its limits.

/** A quota with the scope it applies to, as `toolmesh quotas list` shows it. */
export interface ScopedQuota {
  /** Its key in the quotas bucket (`{tenant}`, `{tenant}.tool.{tool}`, `{tenant}.agent.{agent}`). */
  key: string;
  scope: QuotaScope;
  quota: Quota;
}

/** What is stored under a quota key: the ids of the scope (keys hold tokens) and the limits. */
export interface StoredQuota {
  scope: { tenant: string; tool?: string; agent?: string };
  quota: Quota;
}

export function decodeStoredQuota(value: Uint8Array): StoredQuota {
  const raw = decodeJson(value) as { scope?: unknown; quota?: unknown } | null;
  const scope = raw?.scope as StoredQuota["scope"] | undefined;
  if (typeof scope?.tenant !== "string") {
    throw new ToolmeshError(ErrorCode.InvalidRequest, "stored quota names no tenant");
  }
  return { scope, quota: parseQuota(raw?.quota) };
}

export function quotaBucketSpecs(subjects: Subjects, replicas: number | undefined) {
  const { quotas, quotaUsage } = meshPlan(subjects, { replicas }).buckets;
  return { quotas, quotaUsage };
}

export async function openQuotaBucket(nc: NatsConnection, spec: StreamSpec): Promise<KV> {
  return openBucket(nc, await jetstreamManager(nc), spec, { existing: "keep" });
}

/** Reads and writes quotas: what `toolmesh quotas` uses. */
export class QuotaStore {
  readonly #kv: KV;
  readonly #usage: KV;
  readonly #jsm: JetStreamManager;
  readonly #bucket: string;

  private constructor(kv: KV, usage: KV, jsm: JetStreamManager, bucket: string) {
    this.#kv = kv;
    this.#usage = usage;
    this.#jsm = jsm;
    this.#bucket = bucket;
  }

  /** Opens (creating when missing) the quotas and usage buckets. */
  static async open(
    nc: NatsConnection,
    options: { subjects: Subjects; replicas?: number },
  ): Promise<QuotaStore> {
    const specs = quotaBucketSpecs(options.subjects, options.replicas);
    return new QuotaStore(
      await openQuotaBucket(nc, specs.quotas),
      await openQuotaBucket(nc, specs.quotaUsage),
      await jetstreamManager(nc),
      options.subjects.quotasBucket,
    );
  }

  /**
   * Sets the limits of a scope, merged over what it had (`undefined` fields keep their value,
   * `null` ones are removed). Returns what is stored now.
   */
  async set(
    scope: QuotaScope,
    limits: { [K in keyof Quota]?: Quota[K] | null },
  ): Promise<ScopedQuota> {
    const key = quotaKey(scope);
    const tenantOnly = (["weight", "max_stored_bytes"] as const).find((f) => limits[f] != null);
    if (tenantOnly !== undefined && (scope.tool !== undefined || scope.agent !== undefined)) {
      throw new ToolmeshError(
        ErrorCode.InvalidRequest,
        `${tenantOnly === "weight" ? "a weight" : "max_stored_bytes"} applies to a whole tenant, not to one of its tools or agents`,
      );
    }
    for (;;) {
      const entry = await this.#kv.get(key);
      const current = entry?.operation === "PUT" ? decodeStoredQuota(entry.value).quota : {};
      const merged: Record<string, unknown> = { ...current };
      for (const [field, value] of Object.entries(limits)) {
        if (value === null) delete merged[field];
        else if (value !== undefined) merged[field] = value;
      }
      const quota = parseQuota(merged);
      const stored: StoredQuota = { scope: scopeIds(scope), quota };
      try {
        if (entry === null) await this.#kv.create(key, encodeJson(stored));
        else await this.#kv.update(key, encodeJson(stored), entry.revision);
        return { key, scope: stored.scope, quota };
      } catch (err) {
        if (!isWrongLastSequence(err)) throw err;
      }
    }
  }

  /** The quota of a scope, or undefined. */
  async get(scope: QuotaScope): Promise<ScopedQuota | undefined> {
    const key = quotaKey(scope);
    const entry = await this.#kv.get(key);
    if (entry?.operation !== "PUT") return undefined;
    const stored = decodeStoredQuota(entry.value);
    return { key, ...stored };
  }

  /** Every quota, or a tenant's, ordered by key. */
  async list(tenant?: string): Promise<ScopedQuota[]> {
    // Message gets, not a key listing: listing fails on nats-server 2.9 while a node is down.
    const filters =
      tenant === undefined ? [">"] : [subjectToken(tenant), `${subjectToken(tenant)}.>`];
    const found: ScopedQuota[] = [];
    for (const filter of filters)
      for (const { key, value } of await scanBucket(this.#jsm, this.#bucket, filter))
        found.push({ key, ...decodeStoredQuota(value) });
    return found.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
  }

  /** Removes a scope's quota (and what it counted); false when it had none. */
  async remove(scope: QuotaScope): Promise<boolean> {
    const key = quotaKey(scope);
    const entry = await this.#kv.get(key);
    if (entry?.operation !== "PUT") return false;
    await this.#kv.delete(key);
    await this.#usage.delete(key);
    return true;
  }

  /** What a scope uses now: calls in flight, of which queued, and the day's count. */
  async usage(scope: QuotaScope): Promise<UsageSummary> {
    const entry = await this.#usage.get(quotaKey(scope));
    return summarize(entry?.operation === "PUT" ? decodeUsage(entry.value) : emptyUsage());
  }
}

function scopeIds(scope: QuotaScope): StoredQuota["scope"] {
  return {
    tenant: scope.tenant,
    ...(scope.tool === undefined ? {} : { tool: scope.tool }),
    ...(scope.agent === undefined ? {} : { agent: scope.agent }),
  };
}
// ---------------------------------------------------------------------------------------------
// Usage, kept by compare-and-set.

/** One counted call: its deadline and when it was counted (ms), and whether it is queued. */
export interface UsageEntry {
  d: number;
  t: number;
  q?: 1;
}

/** What one scope uses. Calls are counted by call key, so counting one twice is impossible. */
export interface Usage {
  in_flight: Record<string, UsageEntry>;
  /** Tokens left in the bucket, as of `at` (ms). */
  tokens?: number;
  at?: number;
  /** The UTC day (`YYYY-MM-DD`) `count` counts. */
  day?: string;
  count?: number;
}

/** What `toolmesh quotas get` shows of a scope's use. */
export interface UsageSummary {
  in_flight: number;
  queued: number;
  /** Calls counted today (UTC). */
  today: number;
  /** Tokens left, when the scope has a rate. */
  tokens?: number;
}

export function emptyUsage(): Usage {
  return { in_flight: {} };
}

export function decodeUsage(value: Uint8Array): Usage {
  const usage = decodeJson(value) as Usage | null;
  if (usage === null || typeof usage.in_flight !== "object") return emptyUsage();
  return usage;
}

function summarize(usage: Usage): UsageSummary {
  const entries = Object.values(usage.in_flight);
  return {
    in_flight: entries.length,
    queued: entries.filter((e) => e.q === 1).length,
    today: usage.day === utcDay(Date.now()) ? (usage.count ?? 0) : 0,
    ...(usage.tokens === undefined ? {} : { tokens: Math.floor(usage.tokens * 100) / 100 }),
  };
}

export function utcDay(ms: number): string {
  return new Date(ms).toISOString().slice(0, 10);
}
