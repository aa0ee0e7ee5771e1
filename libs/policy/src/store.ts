import type { NatsConnection, QueuedIterator } from "@nats-io/nats-core";
import { jetstreamManager } from "@nats-io/jetstream";
import type { KV, KvWatchEntry } from "@nats-io/kv";
import type { Subjects } from "@toolmesh/protocol";
import { subjectToken } from "@toolmesh/protocol";
import type { WatchLoadedOptions } from "@toolmesh/nats";
import { meshPlan, openBucket, warnUnavailable, watchLoaded } from "@toolmesh/nats";
import { CompiledPolicySet } from "./policy-set.js";
import { PolicyDecider } from "./decider.js";

/** The key of a set in the policies bucket: `operator`, or `tenant.<tenant token>`. */
export function policyKey(tenant?: string): string {
  return tenant === undefined ? "operator" : `tenant.${subjectToken(tenant)}`;
}

/** A stored policy set: its text and the revision (the policy version) it was stored at. */
export interface StoredPolicySet {
  text: string;
  revision: number;
  /** When it was stored, ms since the epoch. */
  storedAt: number;
}

/** Opens (creating when missing) the policies bucket. */
export async function openPolicyBucket(
  nc: NatsConnection,
  options: { subjects: Subjects; replicas?: number | undefined },
): Promise<KV> {
  const spec = meshPlan(options.subjects, { replicas: options.replicas }).buckets.policies;
  return openBucket(nc, await jetstreamManager(nc), spec, { existing: "keep" });
}

/** Reads and writes policy sets: what `toolmesh policy` uses. Each write is validated first. */
export class PolicyStore {
  readonly #kv: KV;

  constructor(kv: KV) {
    this.#kv = kv;
  }

  /** Validates and stores a set; throws a `PolicySetError` (and stores nothing) when invalid. */
  async set(text: string, tenant?: string): Promise<StoredPolicySet> {
    CompiledPolicySet.compile(text);
    const revision = await this.#kv.put(policyKey(tenant), text);
    return { text, revision, storedAt: Date.now() };
  }

  /** The set in force, or undefined. */
  async get(tenant?: string): Promise<StoredPolicySet | undefined> {
    const entry = await this.#kv.get(policyKey(tenant));
    if (entry === null || entry.operation !== "PUT") return undefined;
    return { text: entry.string(), revision: entry.revision, storedAt: entry.created.getTime() };
  }

  /** Every stored version of a set, oldest first (as many as the bucket keeps). */
  async history(tenant?: string): Promise<StoredPolicySet[]> {
    const versions: StoredPolicySet[] = [];
    for await (const entry of await this.#kv.history({ key: policyKey(tenant) })) {
      if (entry.operation === "PUT")
        versions.push({
          text: entry.string(),
          revision: entry.revision,
          storedAt: entry.created.getTime(),
        });
    }
    return versions;
  }

  /** Removes a set (its history stays); whether there was one. */
  async rm(tenant?: string): Promise<boolean> {
    const had = (await this.get(tenant)) !== undefined;
    if (had) await this.#kv.delete(policyKey(tenant));
    return had;
  }
}

/** Where the view reports what it applied and what it could not. */
export interface PolicyViewLog {
  info(obj: object, msg: string): void;
  warn(obj: object, msg: string): void;
  error(obj: object, msg: string): void;
}

/**
 * The sets in force, kept current by a KV watch: every resolver and catalog holds them in a
 * {@link PolicyDecider}. A stored set that does not compile (written past the CLI) is
 * replaced by an empty set, which permits nothing: a broken policy never opens the door.
 */
export class PolicyView {
  /** The decider the watched sets are applied to. */
  readonly decider: PolicyDecider;
  #watcher: QueuedIterator<KvWatchEntry> | undefined;
  readonly #log: PolicyViewLog;
  readonly #changes = new Set<(key: string, revision: number) => void>();

  private constructor(log: PolicyViewLog) {
    this.#log = log;
    this.decider = new PolicyDecider();
  }

  /** Opens (creating when missing) the policies bucket, loads every set and keeps watching. */
  static async open(
    nc: NatsConnection,
    options: { subjects: Subjects; replicas?: number | undefined; log: PolicyViewLog } & Pick<
      WatchLoadedOptions,
      "stallMs"
    >,
  ): Promise<PolicyView> {
    const { subjects, log, stallMs } = options;
    const kv = await openPolicyBucket(nc, options);
    const view = new PolicyView(log);
    view.#watcher = await watchLoaded(kv, (entry) => view.#apply(entry), {
      what: "load the policy sets",
      ...(stallMs !== undefined && { stallMs }),
      onRetry: warnUnavailable(log, subjects.policiesBucket, "bucket"),
    });
    return view;
  }

  /** Tells `listener` the key and revision of every set applied; returns the way to stop. */
  onChange(listener: (key: string, revision: number) => void): () => void {
    this.#changes.add(listener);
    return () => this.#changes.delete(listener);
  }

  /** Stops watching. */
  close(): void {
    this.#watcher?.stop();
  }

  #apply(entry: KvWatchEntry): void {
    const tenant = entry.key.startsWith("tenant.") ? entry.key.slice("tenant.".length) : undefined;
    if (tenant === undefined && entry.key !== "operator") return;
    let scope: { set: CompiledPolicySet; revision: number } | undefined;
    if (entry.operation === "PUT") {
      try {
        scope = { set: CompiledPolicySet.compile(entry.string()), revision: entry.revision };
      } catch (err) {
        this.#log.error(
          { key: entry.key, revision: entry.revision, err },
          "stored policy set is invalid; nothing is permitted under it until it is replaced",
        );
        scope = { set: CompiledPolicySet.compile(""), revision: entry.revision };
      }
    }
    if (tenant === undefined) this.decider.setOperator(scope);
    else this.decider.setTenant(tenant, scope);
    this.#log.info(
      { key: entry.key, revision: entry.revision, removed: scope === undefined },
      "policy set applied",
    );
    for (const listener of this.#changes) listener(entry.key, entry.revision);
  }
}
