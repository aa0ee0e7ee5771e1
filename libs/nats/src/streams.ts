import { Defaults, subjectToken } from "@toolmesh/protocol";
import type { NatsConnection } from "@nats-io/nats-core";
import type { JetStreamManager, StreamConfig } from "@nats-io/jetstream";
import { DiscardPolicy, RetentionPolicy, StorageType, jetstreamManager } from "@nats-io/jetstream";
import { nanos } from "@nats-io/nats-core";
import type { Subjects } from "@toolmesh/protocol";
import type { StreamCompression, StreamSpec } from "./provision.js";
import { COMPRESSION_SETTING, REPLICAS_SETTING, bucketStream, ensureStream } from "./provision.js";

/** Limits of the streams toolmesh creates. Durations in ms. */
export interface StreamLimits {
  /** Largest call, work or result message, in bytes. Default 1 MiB. */
  maxMessageBytes?: number;
  /** Window in which a repeated `Nats-Msg-Id` is dropped, in ms. Default 2 min. */
  duplicateWindowMs?: number;
  /** How long session results and schemas are kept, in ms. Default 1 h. */
  sessionRetentionMs?: number;
  /** How long events (missing arguments) are kept, in ms. Default 24 h. */
  eventRetentionMs?: number;
  /** How long dead letters are kept, in ms. Default 7 days. */
  deadLetterRetentionMs?: number;
  /** Most calls waiting in the calls or work stream; more are refused as `overloaded`. Default 1 000 000. */
  maxQueuedCalls?: number;
  /**
   * Most calls of one session (one subject `{p}.v1.calls.{tenant}.{session}`) waiting in the calls
   * stream; the server refuses more before storing them, so one session's flood cannot fill the
   * stream for everyone. Default 1 000.
   */
  maxQueuedCallsPerSession?: number;
  /**
   * Most calls of one tenant waiting in its own calls stream `{P}_CALLS_{tenant}` (ADR 0048),
   * over all its sessions; the server refuses more before storing them. Default 10 000.
   */
  maxQueuedCallsPerTenant?: number;
  /**
   * Bytes the mesh's own streams may hold together, shared out by {@link STORE_SHARES}, so no one
   * stream can take the whole JetStream store. Default 8 GiB.
   */
  storeBytes?: number;
  /** Bytes each tenant's own calls stream `{P}_CALLS_{t}` may hold. Default 256 MiB. */
  tenantStoreBytes?: number;
  /** How long each tenant's audit events are kept (ADR 0060), in ms. Default 90 days. */
  auditRetentionMs?: number;
  /** Bytes each tool owner's work stream `{P}_WORK_{o}` may hold. Default 256 MiB. */
  ownerStoreBytes?: number;
  /** Most dead letters kept in `{P}_DLQ`; past it (or its byte share) the oldest go. Default 100 000. */
  maxDeadLetters?: number;
  /** Replicas of every stream and KV bucket (1, 3 or 5 on a cluster). Default 1. */
  replicas?: number;
  /**
   * Compression of every stream and KV bucket on nats-server 2.10+ (older servers store them as
   * they are, ADR 0044). Default `s2`.
   */
  compression?: StreamCompression;
  /**
   * Whether the work streams and the sessions stream republish the headers of what they store,
   * for the deadline keepers and the count of stored bytes to read instead of every body (ADR
   * 0066). Default off: it spares the resolvers the bodies of large calls and costs the server
   * a little on every call.
   */
  republishHeads?: boolean;
}

/**
 * The share of `TOOLMESH_STORE_BYTES` each of the mesh's streams may hold (`max_bytes`), and the
 * call records (`records`, the bucket `{p}_calls`). The rest (4 %) is left for the other KV
 * buckets (registry, sessions' state, quotas), which stay small. Results get the most, and the
 * same share twice: every final message is kept in the sessions stream and in its call's record,
 * and what each tenant's results may occupy there is bounded per tenant (ADR 0050).
 */
export const STORE_SHARES = {
  calls: 0.1,
  work: 0.1,
  sessions: 0.3,
  records: 0.3,
  events: 0.04,
  dlq: 0.1,
  advisories: 0.01,
} as const;

/** What the mesh's streams may hold, by stream, in bytes, for `limits`. */
export function storeBudget(
  subjects: Subjects,
  limits: StreamLimits = {},
): { stream: string; maxBytes: number }[] {
  const total = limits.storeBytes ?? Defaults.storeBytes;
  return (Object.keys(STORE_SHARES) as (keyof typeof STORE_SHARES)[]).map((key) => ({
    stream: key === "records" ? bucketStream(subjects.callsBucket) : subjects.streams[key],
    maxBytes: Math.floor(total * STORE_SHARES[key]),
  }));
}

type StreamConfigOf = Partial<StreamConfig> & { name: string };

/** What every stream of the mesh shares, and the duplicate window of those that have one. */
function commonConfig(limits: StreamLimits) {
  return {
    common: {
      storage: StorageType.File,
      num_replicas: limits.replicas ?? 1,
      max_msg_size: limits.maxMessageBytes ?? Defaults.maxMessageBytes,
      compression: limits.compression ?? Defaults.streamCompression,
    },
    dup: nanos(limits.duplicateWindowMs ?? Defaults.duplicateWindowMs),
  };
}

/** The work queues: calls waiting for a resolver and work waiting for an executor. */
function queueStreams(subjects: Subjects, limits: StreamLimits): StreamConfigOf[] {
  const { common, dup } = commonConfig(limits);
  const maxMsgs = limits.maxQueuedCalls ?? Defaults.maxQueuedCalls;
  return [
    {
      ...common,
      name: subjects.streams.calls,
      subjects: [subjects.allCalls],
      retention: RetentionPolicy.Workqueue,
      discard: DiscardPolicy.New,
      max_msgs: maxMsgs,
      // A subject is one session: past its limit the server refuses the publish (10077) instead
      // of storing it, whatever the resolvers are doing (docs/quotas.md#storage).
      max_msgs_per_subject: limits.maxQueuedCallsPerSession ?? Defaults.maxQueuedCallsPerSession,
      discard_new_per_subject: true,
      duplicate_window: dup,
    },
    {
      ...common,
      name: subjects.streams.work,
      subjects: [subjects.allWork],
      retention: RetentionPolicy.Workqueue,
      discard: DiscardPolicy.New,
      max_msgs: maxMsgs,
      duplicate_window: dup,
      // The deadline keepers read a work message's headers only (ADR 0066).
      ...(limits.republishHeads === true
        ? { republish: { src: subjects.allWork, dest: subjects.workHeads(), headers_only: true } }
        : {}),
    },
  ];
}

/** The streams kept by age or bounds: answers, events, dead letters and advisories. */
function keptStreams(subjects: Subjects, limits: StreamLimits): StreamConfigOf[] {
  const { common, dup } = commonConfig(limits);
  return [
    {
      ...common,
      name: subjects.streams.sessions,
      subjects: [...subjects.storedSessionEvents],
      // Frontends read stored answers by direct get: the subject is in the API subject
      // (`$JS.API.DIRECT.GET.{stream}.{subject}`), so permissions can confine it per session.
      allow_direct: true,
      retention: RetentionPolicy.Limits,
      discard: DiscardPolicy.Old,
      max_age: nanos(limits.sessionRetentionMs ?? Defaults.sessionRetentionMs),
      duplicate_window: dup,
      // The deadline keepers and admission read a final message's headers only (ADR 0066).
      ...(limits.republishHeads === true
        ? {
            republish: {
              src: subjects.allResults,
              dest: subjects.resultHeads,
              headers_only: true,
            },
          }
        : {}),
    },
    {
      ...common,
      name: subjects.streams.events,
      subjects: [subjects.allEvents],
      retention: RetentionPolicy.Limits,
      discard: DiscardPolicy.Old,
      max_age: nanos(limits.eventRetentionMs ?? Defaults.eventRetentionMs),
      duplicate_window: dup,
    },
    {
      ...common,
      name: subjects.streams.dlq,
      subjects: [subjects.allDlq],
      retention: RetentionPolicy.Limits,
      // Past its bounds the oldest letters go, never a new one: the mesh dead-letters work to
      // take it out of a work queue, and a refused letter would leave it there (ADR 0051).
      discard: DiscardPolicy.Old,
      max_msgs: limits.maxDeadLetters ?? Defaults.maxDeadLetters,
      max_age: nanos(limits.deadLetterRetentionMs ?? Defaults.deadLetterRetentionMs),
      duplicate_window: dup,
    },
    {
      ...common,
      name: subjects.streams.advisories,
      // Named streams, not every stream's (`…MAX_DELIVERIES.*.*`): a second mesh (prefix) of
      // the account keeps its own. Each tool owner's work stream adds its subject
      // ({@link ownerAdvisoriesSpec}), kept when the mesh's are brought up to date.
      subjects: [subjects.streams.calls, subjects.streams.work].map((s) =>
        subjects.maxDeliveriesAdvisory(s),
      ),
      retention: RetentionPolicy.Workqueue,
      discard: DiscardPolicy.Old,
    },
  ];
}

/** The streams for a prefix, each with the variables that set its fields. */
export function streamSpecs(subjects: Subjects, limits: StreamLimits = {}): StreamSpec[] {
  const budget = new Map(storeBudget(subjects, limits).map((b) => [b.stream, b.maxBytes]));
  const settings = {
    num_replicas: REPLICAS_SETTING,
    compression: COMPRESSION_SETTING,
    max_msg_size: "TOOLMESH_MAX_MESSAGE_BYTES",
    duplicate_window: "TOOLMESH_DUPLICATE_WINDOW_MS",
    max_msgs: "TOOLMESH_MAX_QUEUED_CALLS",
    max_msgs_per_subject: "TOOLMESH_MAX_QUEUED_CALLS_PER_SESSION",
    max_bytes: "TOOLMESH_STORE_BYTES",
    republish: "TOOLMESH_REPUBLISH_HEADS",
  };
  const configs = [...queueStreams(subjects, limits), ...keptStreams(subjects, limits)];
  return configs.map((config) => ({
    kind: "stream",
    name: config.name,
    config: { ...config, max_bytes: budget.get(config.name) ?? -1 },
    settings:
      config.name === subjects.streams.dlq
        ? { ...settings, max_msgs: "TOOLMESH_MAX_DEAD_LETTERS" }
        : settings,
    ...(config.name === subjects.streams.advisories
      ? {
          addsSubjects: true,
          // The max-deliveries advisories of every owner's work stream (ADR 0041) and of every
          // tenant's calls stream (ADR 0048).
          addsSubjectsFor: [subjects.allOwnerWork, subjects.allTenantStreamCalls].map(
            (streams) => ({ streams, subject: subjects.maxDeliveriesAdvisory("{stream}") }),
          ),
        }
      : {}),
  }));
}

/** The spec of the mesh's stream `name`. */
function meshStream(subjects: Subjects, limits: StreamLimits, name: string): StreamSpec {
  const spec = streamSpecs(subjects, limits).find((s) => s.name === name);
  if (spec === undefined) throw new Error(`the mesh plan has no stream ${name}`);
  return spec;
}

/**
 * The work stream of tool owner `owner` (ADR 0041): the mesh's work stream's configuration over
 * the owner's work subjects, so `toolmesh setup` and the same variables set both.
 */
export function ownerWorkStreamSpec(
  subjects: Subjects,
  owner: string,
  limits: StreamLimits = {},
): StreamSpec {
  const work = meshStream(subjects, limits, subjects.streams.work);
  const name = subjects.workStream(owner);
  return {
    ...work,
    name,
    config: {
      ...work.config,
      name,
      subjects: [subjects.ownerWork(owner)],
      // The mesh's work stream's republish, over the owner's subjects (ADR 0066).
      ...(work.config.republish === undefined
        ? {}
        : {
            republish: {
              src: subjects.ownerWork(owner),
              dest: subjects.workHeads(owner),
              headers_only: true,
            },
          }),
      max_bytes: limits.ownerStoreBytes ?? Defaults.ownerStoreBytes,
    },
    settings: { ...work.settings, max_bytes: "TOOLMESH_OWNER_STORE_BYTES" },
  };
}

/**
 * The calls stream of tenant `tenant` (ADR 0048): the mesh's calls stream's configuration over
 * the subjects its account's import renames its calls to, holding at most
 * `TOOLMESH_MAX_QUEUED_CALLS_PER_TENANT` calls (and the same per session as the mesh's).
 */
export function tenantCallsStreamSpec(
  subjects: Subjects,
  tenant: string,
  limits: StreamLimits = {},
): StreamSpec {
  const calls = meshStream(subjects, limits, subjects.streams.calls);
  const name = subjects.callsStream(tenant);
  return {
    ...calls,
    name,
    config: {
      ...calls.config,
      name,
      subjects: [subjects.tenantStreamCalls(tenant)],
      max_msgs: limits.maxQueuedCallsPerTenant ?? Defaults.maxQueuedCallsPerTenant,
      max_bytes: limits.tenantStoreBytes ?? Defaults.tenantStoreBytes,
    },
    settings: {
      ...calls.settings,
      max_msgs: "TOOLMESH_MAX_QUEUED_CALLS_PER_TENANT",
      max_bytes: "TOOLMESH_TENANT_STORE_BYTES",
    },
  };
}

/**
 * The audit stream of tenant `tenant` (ADR 0060), beside its calls stream: its hash-chained
 * events, kept `TOOLMESH_AUDIT_RETENTION`, bounded like the calls stream by
 * `TOOLMESH_TENANT_STORE_BYTES`. Delete and purge are denied by the server; a full stream
 * refuses new events (discard new) rather than dropping old ones.
 */
export function tenantAuditStreamSpec(
  subjects: Subjects,
  tenant: string,
  limits: StreamLimits = {},
): StreamSpec {
  const token = subjectToken(tenant);
  const name = subjects.auditStream(token);
  return {
    kind: "stream",
    name,
    config: {
      name,
      subjects: [subjects.audit(token)],
      storage: StorageType.File,
      num_replicas: limits.replicas ?? 1,
      max_msg_size: limits.maxMessageBytes ?? Defaults.maxMessageBytes,
      compression: limits.compression ?? Defaults.streamCompression,
      retention: RetentionPolicy.Limits,
      discard: DiscardPolicy.New,
      max_age: nanos(limits.auditRetentionMs ?? Defaults.auditRetentionMs),
      max_bytes: limits.tenantStoreBytes ?? Defaults.tenantStoreBytes,
      deny_delete: true,
      deny_purge: true,
      // The tenant's approver reads its own trail from the tenant's account by direct get.
      allow_direct: true,
    },
    settings: {
      num_replicas: REPLICAS_SETTING,
      compression: COMPRESSION_SETTING,
      max_msg_size: "TOOLMESH_MAX_MESSAGE_BYTES",
      max_age: "TOOLMESH_AUDIT_RETENTION",
      max_bytes: "TOOLMESH_TENANT_STORE_BYTES",
    },
  };
}

/**
 * The advisories stream with the max-deliveries advisories of `stream` (a tool owner's work
 * stream, a tenant's calls stream) among its subjects, so its messages are dead-lettered like
 * the mesh's. Made with that stream.
 */
export function advisoriesSpecWith(
  subjects: Subjects,
  stream: string,
  limits: StreamLimits = {},
): StreamSpec {
  const spec = meshStream(subjects, limits, subjects.streams.advisories);
  const own = subjects.maxDeliveriesAdvisory(stream);
  return { ...spec, config: { ...spec.config, subjects: [...(spec.config.subjects ?? []), own] } };
}

/**
 * The advisories stream with the max-deliveries advisories of tool owner `owner`'s work stream
 * among its subjects (ADR 0041), so that work is dead-lettered like the mesh's. The mesh creates
 * it with the owner's work stream.
 */
export function ownerAdvisoriesSpec(
  subjects: Subjects,
  owner: string,
  limits: StreamLimits = {},
): StreamSpec {
  return advisoriesSpecWith(subjects, subjects.workStream(owner), limits);
}

/**
 * Creates the streams, or brings their configuration up to date (see {@link ensureStream}).
 * Safe to call from many services at once.
 */
export async function ensureStreams(
  nc: NatsConnection,
  subjects: Subjects,
  limits: StreamLimits = {},
): Promise<JetStreamManager> {
  const jsm = await jetstreamManager(nc);
  for (const spec of streamSpecs(subjects, limits)) await ensureStream(jsm, spec);
  return jsm;
}
