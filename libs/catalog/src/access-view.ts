import type { NatsConnection, QueuedIterator } from "@nats-io/nats-core";
import type { KV, KvWatchEntry } from "@nats-io/kv";
import { jetstreamManager } from "@nats-io/jetstream";
import type { SessionAddress, ToolDefinition, ToolmeshError } from "@toolmesh/protocol";
import type { WatchLoadedOptions } from "@toolmesh/nats";
import { warnUnavailable, watchLoaded } from "@toolmesh/nats";
import type { AgentProfile } from "./config.js";
import type { GroupSwitches, SessionPolicy } from "./policy.js";
import { checkToolAccess } from "./policy.js";
import type { StateStore } from "./state.js";
import { decodePolicy, decodeTenantGroups } from "./state.js";

/** Something that wants to hear about state it cannot read (a pino logger fits). */
export interface AccessViewLog {
  warn(obj: object, msg: string): void;
}

/** Options of {@link AccessView.open}. */
export interface AccessViewOptions {
  /** The configured agents (see `loadCatalogConfig`). */
  agents: ReadonlyMap<string, AgentProfile>;
  log: AccessViewLog;
  /** How long a watcher's first load may stay silent before another is started; default 15 s. */
  stallMs?: number;
}

interface CachedPolicy {
  policy: SessionPolicy;
  /** Server time of the write, epoch ms: the bucket's TTL counts from it. */
  writtenAt: number;
}

/**
 * An in-memory copy of every tenant's group switches and every session's policy (group
 * overrides, bound agent), kept current by KV watchers, so checking a call costs two map
 * lookups and no request. Changes reach it within the watchers' delivery delay (milliseconds):
 * a call resolved in that window is checked against the state before the change.
 */
export class AccessView {
  readonly #agents: ReadonlyMap<string, AgentProfile>;
  readonly #log: AccessViewLog;
  readonly #ttlMs: number;
  readonly #tenants = new Map<string, GroupSwitches>();
  readonly #sessions = new Map<string, CachedPolicy>();
  readonly #watchers: QueuedIterator<KvWatchEntry>[] = [];

  private constructor(
    agents: ReadonlyMap<string, AgentProfile>,
    log: AccessViewLog,
    ttlMs: number,
  ) {
    this.#agents = agents;
    this.#log = log;
    this.#ttlMs = ttlMs;
  }

  /** Loads the current state of both buckets and keeps watching them. */
  static async open(
    nc: NatsConnection,
    store: StateStore,
    options: AccessViewOptions,
  ): Promise<AccessView> {
    const view = new AccessView(options.agents, options.log, store.sessionTtlMs);
    const jsm = await jetstreamManager(nc);
    const { subjects } = store;
    const policies = subjects.allSessionPolicies;
    // The sessions bucket holds schemas too: only the policy keys are counted.
    const policyKeys = async (): Promise<number> => {
      const info = await jsm.streams.info(`KV_${subjects.sessionsBucket}`, {
        subjects_filter: `$KV.${subjects.sessionsBucket}.${policies}`,
      });
      return Object.keys(info.state.subjects ?? {}).length;
    };
    const { stallMs } = options;
    await Promise.all([
      view.#watch(store.groups, subjects.groupsBucket, { stallMs }, (e) => view.#applyTenant(e)),
      view.#watch(
        store.sessions,
        subjects.sessionsBucket,
        { key: policies, stored: policyKeys, stallMs },
        (e) => view.#applyPolicy(e),
      ),
    ]);
    return view;
  }

  /** The agents this view checks against. */
  get agents(): ReadonlyMap<string, AgentProfile> {
    return this.#agents;
  }

  /** The tenant's group switches (tenant token). */
  tenantGroups(tenant: string): GroupSwitches | undefined {
    return this.#tenants.get(tenant);
  }

  /** The session's policy, unless it expired. */
  sessionPolicy(at: SessionAddress): SessionPolicy | undefined {
    const key = `${at.tenant}.${at.session}`;
    const cached = this.#sessions.get(key);
    if (cached === undefined) return undefined;
    if (this.#ttlMs > 0 && cached.writtenAt + this.#ttlMs <= Date.now()) {
      // The bucket dropped it without telling the watcher.
      this.#sessions.delete(key);
      return undefined;
    }
    return cached.policy;
  }

  /**
   * Why the session may not call the tool (`permission_denied` or `tool_disabled`, see
   * `checkToolAccess`), or `undefined` when it may. `agent` is the call's `agent` field.
   */
  check(def: ToolDefinition, at: SessionAddress, agent?: string): ToolmeshError | undefined {
    return checkToolAccess(def, {
      tenantGroups: this.#tenants.get(at.tenant),
      session: this.sessionPolicy(at),
      agent,
      agents: this.#agents,
    });
  }

  /** Stops watching. */
  close(): void {
    for (const watcher of this.#watchers) watcher.stop();
  }

  /** Watches `kv`, the bucket named `bucket` ({@link watchLoaded}'s options). */
  async #watch(
    kv: KV,
    bucket: string,
    options: Pick<WatchLoadedOptions, "key" | "stored" | "stallMs">,
    apply: (entry: KvWatchEntry) => void,
  ): Promise<void> {
    const safely = (entry: KvWatchEntry): void => {
      try {
        apply(entry);
      } catch (err) {
        this.#log.warn({ key: entry.key, err }, "ignoring a state entry that cannot be read");
      }
    };
    const watcher = await watchLoaded(kv, safely, {
      ...options,
      what: `load the state of bucket ${bucket}`,
      onRetry: warnUnavailable(this.#log, bucket, "bucket"),
    });
    this.#watchers.push(watcher);
  }

  #applyTenant(entry: KvWatchEntry): void {
    if (entry.operation !== "PUT") {
      this.#tenants.delete(entry.key);
      return;
    }
    const state = decodeTenantGroups(entry.value);
    if (state === undefined) {
      this.#log.warn({ key: entry.key }, "ignoring tenant group state that is not valid");
      return;
    }
    this.#tenants.set(entry.key, state.groups);
  }

  #applyPolicy(entry: KvWatchEntry): void {
    // `{tenant}.{session}.policy` → `{tenant}.{session}`
    const key = entry.key.slice(0, entry.key.lastIndexOf("."));
    if (entry.operation !== "PUT") {
      this.#sessions.delete(key);
      return;
    }
    const state = decodePolicy(entry.value);
    if (state === undefined) {
      this.#log.warn({ key: entry.key }, "ignoring session policy that is not valid");
      return;
    }
    this.#sessions.set(key, {
      policy: { agent: state.agent, groups: state.groups },
      writtenAt: entry.created.getTime(),
    });
  }
}
