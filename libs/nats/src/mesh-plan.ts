import type { NatsConnection } from "@nats-io/nats-core";
import { jetstreamManager } from "@nats-io/jetstream";
import type { JetStreamManager } from "@nats-io/jetstream";
import type { Subjects } from "@toolmesh/protocol";
import { Defaults } from "@toolmesh/protocol";
import type { ConsumerSpec, EnsureOptions, ProvisionChange, StreamSpec } from "./provision.js";
import { bucketSpec, durableConsumerSpec, ensureConsumer, ensureStream } from "./provision.js";
import type { StreamLimits } from "./streams.js";
import {
  STORE_SHARES,
  advisoriesSpecWith,
  ownerAdvisoriesSpec,
  ownerWorkStreamSpec,
  streamSpecs,
  tenantCallsStreamSpec,
  tenantAuditStreamSpec,
} from "./streams.js";

/** Everything that shapes the streams, buckets and shared consumers. Durations in ms. */
export interface MeshSettings extends StreamLimits {
  /** How long call records are kept (the idempotency horizon), in ms. Default 24 h. */
  callRetentionMs?: number;
  /** How long a session's state lives after its last change, in ms. Default 24 h. */
  sessionStateTtlMs?: number;
  /** Ack wait of the resolver's and schema expander's consumers, in ms. Default 10 000. */
  ackWaitMs?: number;
}

/** Every stream, KV bucket and shared durable consumer of a mesh. */
export interface MeshPlan {
  streams: StreamSpec[];
  buckets: {
    registry: StreamSpec;
    calls: StreamSpec;
    sessions: StreamSpec;
    groups: StreamSpec;
    /** Approved MCP tool definitions, with some history for operators. */
    toolApprovals: StreamSpec;
    /** Quotas per tenant, tenant × tool and tenant × agent. */
    quotas: StreamSpec;
    /** What each quota scope uses, kept by compare-and-set. */
    quotaUsage: StreamSpec;
    /** The operator's and tenants' policy sets, with history for operators. */
    policies: StreamSpec;
    /** Calls waiting for a person's approval, changed by compare-and-set (ADR 0059). */
    callApprovals: StreamSpec;
    /** Users' secrets, sealed, for the mesh account's executors (an owner's are in its account). */
    userSecrets: StreamSpec;
  };
  /**
   * Consumers shared by every replica of a service. Executors add one work consumer per tool
   * when they register it, so those are not part of the plan.
   */
  consumers: {
    resolver: ConsumerSpec;
    deadLetters: ConsumerSpec;
    schemaExpander: ConsumerSpec;
  };
}

/**
 * Streams earlier versions created that the mesh no longer uses: the deadline timers, replaced
 * by the deadline keeper watching the work stream (docs/adr/0028).
 */
export function obsoleteStreams(subjects: Subjects): string[] {
  return [subjects.streams.calls.replace(/_CALLS$/, "_TIMERS")];
}

/** The streams, buckets and shared consumers for a prefix and settings. */
export function meshPlan(subjects: Subjects, settings: MeshSettings = {}): MeshPlan {
  const { replicas } = settings;
  // Stores that open one bucket pass no compression and leave it as it is (ADR 0044).
  const { compression } = settings;
  const ackWaitMs = settings.ackWaitMs ?? Defaults.ackWaitMs;
  const ackWaitSetting = { ack_wait: "TOOLMESH_ACK_WAIT_MS" };
  return {
    streams: streamSpecs(subjects, settings),
    buckets: {
      registry: bucketSpec(subjects.registryBucket, { replicas, compression }),
      calls: bucketSpec(subjects.callsBucket, {
        replicas,
        compression,
        ttlMs: settings.callRetentionMs ?? Defaults.callRetentionMs,
        ttlSetting: "TOOLMESH_CALL_RETENTION_MS",
        // Every final message is kept in its record too: bounded like the sessions stream, so
        // what tenants may store (bounded per tenant) fits, and no record write can fill the store.
        maxBytes: {
          bytes: Math.floor((settings.storeBytes ?? Defaults.storeBytes) * STORE_SHARES.records),
          setting: "TOOLMESH_STORE_BYTES",
        },
      }),
      sessions: bucketSpec(subjects.sessionsBucket, {
        replicas,
        compression,
        ttlMs: settings.sessionStateTtlMs ?? Defaults.sessionStateTtlMs,
        ttlSetting: "TOOLMESH_SESSION_STATE_TTL_MS",
      }),
      groups: bucketSpec(subjects.groupsBucket, { replicas, compression }),
      toolApprovals: bucketSpec(subjects.toolApprovalsBucket, {
        replicas,
        compression,
        history: 10,
      }),
      quotas: bucketSpec(subjects.quotasBucket, { replicas, compression, history: 5 }),
      quotaUsage: bucketSpec(subjects.quotaUsageBucket, { replicas, compression }),
      policies: bucketSpec(subjects.policiesBucket, { replicas, compression, history: 16 }),
      // Calls waiting for a person (ADR 0059): kept as long as call records, so a waiting call
      // is never forgotten before its record could be.
      callApprovals: bucketSpec(subjects.callApprovalsBucket, {
        replicas,
        compression,
        ttlMs: settings.callRetentionMs ?? Defaults.callRetentionMs,
        ttlSetting: "TOOLMESH_CALL_RETENTION_MS",
      }),
      userSecrets: bucketSpec(subjects.userSecretsBucket, { replicas, compression }),
    },
    consumers: {
      resolver: durableConsumerSpec({
        stream: subjects.streams.calls,
        name: subjects.resolverConsumer,
        ackWaitMs,
        // With backoff up to 10 s between deliveries this rides out a couple of minutes of
        // trouble downstream; a call failing its resolver this often is dead-lettered.
        maxDeliver: 20,
        maxAckPending: 10_000,
        settings: ackWaitSetting,
      }),
      deadLetters: durableConsumerSpec({
        stream: subjects.streams.advisories,
        name: subjects.deadLetterConsumer,
        ackWaitMs: 30_000,
        maxDeliver: -1,
        maxAckPending: 1_000,
      }),
      schemaExpander: durableConsumerSpec({
        stream: subjects.streams.events,
        name: subjects.schemaExpanderConsumer,
        filterSubject: subjects.allMissingArguments,
        ackWaitMs,
        maxDeliver: 10,
        maxAckPending: 1_000,
        settings: ackWaitSetting,
      }),
    },
  };
}

/** The ids `x` of the streams `{base}_x` over `filter`: the owners' or tenants' that exist. */
async function streamsOf(jsm: JetStreamManager, base: string, filter: string): Promise<string[]> {
  const ids: string[] = [];
  for await (const name of jsm.streams.names(filter))
    if (name.startsWith(`${base}_`)) ids.push(name.slice(base.length + 1));
  return ids;
}

/**
 * Creates or updates the work stream of each tool owner named and of every owner that has one
 * already (ADR 0041), with the mesh's work stream's settings (replicas, limits). What
 * `toolmesh setup` runs after {@link provisionMesh}; the owner services create an owner's
 * stream when it first registers a tool.
 */
export async function provisionOwnerWork(
  nc: NatsConnection,
  subjects: Subjects,
  settings: MeshSettings,
  owners: readonly string[] = [],
  options: EnsureOptions = {},
): Promise<ProvisionChange[]> {
  const jsm = await jetstreamManager(nc);
  const all = new Set(owners);
  for (const owner of await streamsOf(jsm, subjects.streams.work, subjects.allOwnerWork))
    all.add(owner);
  const changes: ProvisionChange[] = [];
  for (const owner of [...all].sort()) {
    changes.push(await ensureStream(jsm, ownerWorkStreamSpec(subjects, owner, settings), options));
    changes.push(await ensureStream(jsm, ownerAdvisoriesSpec(subjects, owner, settings), options));
  }
  return changes;
}

/**
 * The resolvers' consumer of tenant `tenant`'s calls stream (ADR 0048): the mesh's resolver
 * consumer's settings, pushing to `{p}.v1.intake` (one subject for every tenant) for the resolvers' one queue group, so
 * a resolver reads every tenant through one subscription each and no pull per tenant.
 */
export function tenantIntakeSpec(
  subjects: Subjects,
  tenant: string,
  settings: MeshSettings = {},
): ConsumerSpec {
  const shared = meshPlan(subjects, settings).consumers.resolver;
  return {
    ...shared,
    stream: subjects.callsStream(tenant),
    config: {
      ...shared.config,
      deliver_subject: subjects.intake,
      deliver_group: subjects.resolverConsumer,
      // What the resolvers hold of one tenant at once, waiting for a slot or a fair turn: each
      // is kept owned by a heartbeat, and a tenant past it waits in its own stream.
      max_ack_pending: 256,
    },
  };
}

/**
 * Creates or updates the calls stream and the resolvers' consumer of each tenant named and of
 * every tenant that has a calls stream already (ADR 0048), with the mesh's settings. What
 * `toolmesh setup --tenants` runs after {@link provisionMesh}: a tenant's stream must exist
 * before its account's first call, which otherwise finds no stream.
 */
export async function provisionTenantCalls(
  nc: NatsConnection,
  subjects: Subjects,
  settings: MeshSettings,
  tenants: readonly string[] = [],
  options: EnsureOptions = {},
): Promise<ProvisionChange[]> {
  const jsm = await jetstreamManager(nc);
  const stem = `${subjects.streams.calls}_`;
  const all = new Set(tenants.map((tenant) => subjects.callsStream(tenant).slice(stem.length)));
  for (const tenant of await streamsOf(jsm, subjects.streams.calls, subjects.allTenantStreamCalls))
    all.add(tenant);
  const changes: ProvisionChange[] = [];
  for (const tenant of [...all].sort()) {
    const stream = await ensureStream(
      jsm,
      tenantCallsStreamSpec(subjects, tenant, settings),
      options,
    );
    changes.push(stream);
    changes.push(
      await ensureStream(jsm, tenantAuditStreamSpec(subjects, tenant, settings), options),
    );
    const advisories = advisoriesSpecWith(subjects, subjects.callsStream(tenant), settings);
    changes.push(await ensureStream(jsm, advisories, options));
    const intake = tenantIntakeSpec(subjects, tenant, settings);
    if (options.dryRun === true && stream.action === "created")
      changes.push({
        kind: "consumer",
        name: `${intake.stream}/${intake.name}`,
        action: "created",
        changes: [],
      });
    else changes.push(await ensureConsumer(jsm, intake, options));
  }
  return changes;
}

/**
 * Creates or updates every stream, bucket and shared consumer of the plan, in that order (a
 * consumer needs its stream), and says what it changed. What `toolmesh setup` runs.
 */
export async function provisionMesh(
  nc: NatsConnection,
  plan: MeshPlan,
  options: EnsureOptions = {},
): Promise<ProvisionChange[]> {
  const jsm = await jetstreamManager(nc);
  const changes: ProvisionChange[] = [];
  for (const spec of [...plan.streams, ...Object.values(plan.buckets)])
    changes.push(await ensureStream(jsm, spec, options));
  for (const spec of Object.values(plan.consumers)) {
    // In a dry run a stream that does not exist yet has no consumers to look at.
    const streamCreated = changes.some(
      (c) => c.kind === "stream" && c.name === spec.stream && c.action === "created",
    );
    if (options.dryRun === true && streamCreated)
      changes.push({
        kind: "consumer",
        name: `${spec.stream}/${spec.name}`,
        action: "created",
        changes: [],
      });
    else changes.push(await ensureConsumer(jsm, spec, options));
  }
  return changes;
}
