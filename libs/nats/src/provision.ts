/**
 * One policy for every stream, KV bucket and durable consumer toolmesh needs: read what the
 * server has first; leave it alone when it matches; create it when missing; update it when it
 * differs; and when the server refuses (no permission, or a setting it cannot change in place)
 * refuse with one line naming the setting and `toolmesh setup`. So services can run with
 * permissions that allow no stream management once `toolmesh setup` has run.
 */
import type { NatsConnection } from "@nats-io/nats-core";
import type {
  ConsumerConfig,
  ConsumerInfo,
  JetStreamManager,
  StreamConfig,
  StreamInfo,
} from "@nats-io/jetstream";
import {
  AckPolicy,
  DeliverPolicy,
  DiscardPolicy,
  JetStreamApiError,
  RetentionPolicy,
  StorageType,
} from "@nats-io/jetstream";
import type { KV } from "@nats-io/kv";
import { Kvm } from "@nats-io/kv";
import { nanos } from "@nats-io/nats-core";
import { JsApiCode } from "./api-codes.js";
import { compareVersions } from "./connection.js";

/** The variable that sets the replica count of every stream and bucket. */
export const REPLICAS_SETTING = "TOOLMESH_STREAM_REPLICAS";

/** The variable that sets the compression of every stream and bucket (ADR 0044). */
export const COMPRESSION_SETTING = "TOOLMESH_STREAM_COMPRESSION";

/** How stored blocks are kept: `s2`-compressed (nats-server 2.10+) or as they are. */
export type StreamCompression = "s2" | "none";

/** The first nats-server that can compress a stream's blocks; older ones store them as they are. */
export const COMPRESSION_SERVER_VERSION = "2.10.0";

/** The first nats-server that lets an update change a stream's republish (2.9 refuses it). */
const REPUBLISH_UPDATE_SERVER_VERSION = "2.10.0";

/** A stream (or the stream behind a KV bucket) as toolmesh wants it. */
export interface StreamSpec {
  kind: "stream" | "bucket";
  /** Stream name; for a bucket, the bucket name (its stream is `KV_<name>`). */
  name: string;
  config: Partial<StreamConfig> & { name: string };
  /** For each configured field, the variable that sets it (shown when it must change). */
  settings: Readonly<Record<string, string>>;
  /**
   * The stream keeps the subjects it has beyond `config.subjects`, which it must have: others
   * add theirs (the advisories stream keeps each tool owner's, ADR 0041).
   */
  addsSubjects?: boolean;
  /**
   * With `addsSubjects`: the subjects others add, one per stream over each `streams` (`subject` with
   * `{stream}` replaced by its name). Each update includes those of the streams listed just
   * before it and is read back until every stream listed then has its subject: an update replaces
   * the subjects and JetStream has no compare-and-set for it, so two processes adding different
   * subjects at once would otherwise lose one.
   */
  addsSubjectsFor?: readonly { streams: string; subject: string }[];
}

/** A durable pull consumer as toolmesh wants it. */
export interface ConsumerSpec {
  stream: string;
  name: string;
  config: Partial<ConsumerConfig> & { durable_name: string };
  /** For each configured field, the variable that sets it. */
  settings: Readonly<Record<string, string>>;
}

/** One field that differs between the server and the configuration. */
export interface FieldChange {
  field: string;
  /** The variable that sets it; undefined for fixed settings. */
  setting: string | undefined;
  from: unknown;
  to: unknown;
}

/** What ensuring one resource did (or, in a dry run, would do). */
export interface ProvisionChange {
  kind: "stream" | "bucket" | "consumer";
  /** Stream, bucket, or `<stream>/<consumer>`. */
  name: string;
  action: "created" | "updated" | "unchanged";
  changes: FieldChange[];
}

/** What may be done about a resource that differs from the configuration. */
export interface EnsureOptions {
  /** Only report what would change. Default false. */
  dryRun?: boolean;
  /**
   * `"update"` (default) brings an existing resource up to date; `"keep"` uses it as it is
   * (for tools that read, such as CLI queries, whose environment may not carry the settings).
   */
  existing?: "update" | "keep";
}

/** A resource cannot be brought in line with the configuration; the service must not start. */
export class ProvisionError extends Error {
  override readonly name = "ProvisionError";
  /** The stream, bucket or consumer concerned. */
  readonly resource: string;

  constructor(message: string, resource: string, options?: ErrorOptions) {
    super(message, options);
    this.resource = resource;
  }
}

/** The stream name behind a KV bucket. */
export function bucketStream(bucket: string): string {
  return `KV_${bucket}`;
}

/** The configuration of a KV bucket's stream, as `@nats-io/kv` creates it. Durations in ms. */
export function bucketSpec(
  bucket: string,
  options: {
    replicas?: number;
    ttlMs?: number;
    ttlSetting?: string;
    history?: number;
    /** Left out: a bucket is created uncompressed and an existing one kept as it is. */
    compression?: StreamCompression;
    /** Bytes the bucket may hold (discard new), and the variable that sets it; default none. */
    maxBytes?: { bytes: number; setting: string };
  },
): StreamSpec {
  return {
    kind: "bucket",
    name: bucket,
    config: {
      name: bucketStream(bucket),
      subjects: [`$KV.${bucket}.>`],
      retention: RetentionPolicy.Limits,
      storage: StorageType.File,
      discard: DiscardPolicy.New,
      max_msgs_per_subject: options.history ?? 1,
      max_msg_size: -1,
      allow_rollup_hdrs: true,
      allow_direct: true,
      num_replicas: options.replicas ?? 1,
      max_age: options.ttlMs === undefined ? 0 : nanos(options.ttlMs),
      ...(options.compression === undefined ? {} : { compression: options.compression }),
      ...(options.maxBytes === undefined ? {} : { max_bytes: options.maxBytes.bytes }),
    },
    settings: {
      num_replicas: REPLICAS_SETTING,
      compression: COMPRESSION_SETTING,
      ...(options.ttlSetting === undefined ? {} : { max_age: options.ttlSetting }),
      ...(options.maxBytes === undefined ? {} : { max_bytes: options.maxBytes.setting }),
    },
  };
}

/** A durable pull consumer as toolmesh configures them. Durations in ms. */
export interface DurableConsumerOptions {
  stream: string;
  name: string;
  /** Only messages on this subject; default every message of the stream. */
  filterSubject?: string;
  /** How long a delivered message stays owned without an ack or a heartbeat, in ms. */
  ackWaitMs: number;
  /** Deliveries before the server gives up (and sends its advisory); -1 for no limit. */
  maxDeliver: number;
  /** Messages delivered and not yet acknowledged, over all its clients. */
  maxAckPending: number;
}

/** A durable pull consumer spec (explicit acks, every message). Durations in ms. */
export function durableConsumerSpec(
  options: DurableConsumerOptions & { settings?: Record<string, string> },
): ConsumerSpec {
  return {
    stream: options.stream,
    name: options.name,
    config: {
      durable_name: options.name,
      ack_policy: AckPolicy.Explicit,
      deliver_policy: DeliverPolicy.All,
      ...(options.filterSubject === undefined ? {} : { filter_subject: options.filterSubject }),
      ack_wait: nanos(options.ackWaitMs),
      max_deliver: options.maxDeliver,
      max_ack_pending: options.maxAckPending,
    },
    settings: options.settings ?? {},
  };
}

function same(a: unknown, b: unknown): boolean {
  if (Array.isArray(a) && Array.isArray(b))
    return JSON.stringify(a.map(String).sort()) === JSON.stringify(b.map(String).sort());
  // The server leaves out false and zero values.
  if (
    (a === undefined && (b === false || b === 0)) ||
    (b === undefined && (a === false || a === 0))
  )
    return true;
  // A nested setting (a republish) is the same when each of its fields is.
  if (isRecord(a) && isRecord(b))
    return [...new Set([...Object.keys(a), ...Object.keys(b)])].every((k) => same(a[k], b[k]));
  return a === b;
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function differences(
  want: Record<string, unknown>,
  have: Record<string, unknown>,
  settings: Readonly<Record<string, string>>,
): FieldChange[] {
  const changes: FieldChange[] = [];
  for (const [field, to] of Object.entries(want)) {
    if (field === "name" || field === "durable_name") continue;
    const from = have[field];
    if (!same(from, to)) changes.push({ field, setting: settings[field], from, to });
  }
  return changes;
}

function reason(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/**
 * How long creating a replicated stream or consumer waits for a cluster peer that is offline
 * (a server restarting, or one a loaded machine has not heard from for a moment), in ms.
 */
const PEER_OFFLINE_WAIT_MS = 30_000;

/**
 * Runs `create` again while the cluster refuses it because a peer is offline, for at most
 * {@link PEER_OFFLINE_WAIT_MS}; then, or for any other refusal, throws what it threw.
 */
async function whilePeerOffline<T>(create: () => Promise<T>): Promise<T> {
  const until = Date.now() + PEER_OFFLINE_WAIT_MS;
  for (let pause = 250; ; pause = Math.min(pause * 2, 2_000)) {
    try {
      return await create();
    } catch (err) {
      if (!(peerOffline(err) && Date.now() + pause < until)) throw err;
      await new Promise((resolve) => setTimeout(resolve, pause));
    }
  }
}

function peerOffline(err: unknown): boolean {
  return err instanceof JetStreamApiError && /peer offline/i.test(err.message);
}

function describe(changes: FieldChange[]): string {
  return changes
    .map(
      (c) =>
        `${c.field} is ${JSON.stringify(c.from)}, ${c.setting ?? "toolmesh"} wants ${JSON.stringify(c.to)}`,
    )
    .join("; ");
}

async function readOrUndefined<T>(read: Promise<T>, notFound: number): Promise<T | undefined> {
  try {
    return await read;
  } catch (err) {
    if (err instanceof JetStreamApiError && err.code === notFound) return undefined;
    throw err;
  }
}

/**
 * The spec as the connected server can take it: before 2.10 it cannot compress (nats.js refuses
 * the field), so the stream is stored as it is there (ADR 0044). The version is that of the
 * server the connection is on.
 */
export function specForServer(spec: StreamSpec, serverVersion: string | undefined): StreamSpec {
  if (spec.config.compression === undefined || serverVersion === undefined) return spec;
  if (compareVersions(serverVersion, COMPRESSION_SERVER_VERSION) >= 0) return spec;
  const { compression: _, ...config } = spec.config;
  return { ...spec, config };
}

/** Whether the server lets an update change a stream's republish (2.10 and later). */
function republishChanges(jsm: JetStreamManager): boolean {
  const version = serverVersion(jsm);
  return version !== undefined && compareVersions(version, REPUBLISH_UPDATE_SERVER_VERSION) >= 0;
}

/** The version of the server a manager's connection is on (the `nc` of nats.js's manager). */
function serverVersion(jsm: JetStreamManager): string | undefined {
  return (jsm as Partial<{ nc: NatsConnection }>).nc?.info?.version;
}

/**
 * Whether a create failed because another process created the stream at the same time: the
 * name is taken, or (nats-server 2.9, when the other create has other subjects) the subjects
 * overlap and the stream now exists.
 */
async function createdMeanwhile(jsm: JetStreamManager, name: string, err: unknown) {
  if (!(err instanceof JetStreamApiError)) return false;
  if (err.code === JsApiCode.StreamNameExist) return true;
  if (err.code !== JsApiCode.StreamSubjectOverlap) return false;
  const info = await readOrUndefined(jsm.streams.info(name), JsApiCode.StreamNotFound).catch(
    () => undefined,
  );
  return info !== undefined;
}

/** Creates, updates or leaves alone one stream (or bucket stream); see the module comment. */
export async function ensureStream(
  jsm: JetStreamManager,
  wanted: StreamSpec,
  options: EnsureOptions = {},
): Promise<ProvisionChange> {
  let spec = specForServer(wanted, serverVersion(jsm));
  const { kind, name } = spec;
  const label = `${kind} ${name}`;
  const info: StreamInfo | undefined = await readOrUndefined(
    jsm.streams.info(spec.config.name),
    JsApiCode.StreamNotFound,
  ).catch((err: unknown) => {
    throw new ProvisionError(
      `cannot read ${label}: ${reason(err)}; this service needs permission for $JS.API.STREAM.INFO.${spec.config.name}`,
      name,
      { cause: err },
    );
  });
  if (info === undefined) {
    if (options.dryRun !== true) {
      try {
        await whilePeerOffline(() => jsm.streams.add(spec.config));
      } catch (err) {
        // Another process created it meanwhile: go through the checks again.
        if (await createdMeanwhile(jsm, spec.config.name, err))
          return ensureStream(jsm, wanted, options);
        throw new ProvisionError(
          `${label} does not exist and cannot be created (${reason(err)}): run \`toolmesh setup\` with credentials that may manage streams${hintFor(err)}`,
          name,
          { cause: err },
        );
      }
    }
    return { kind, name, action: "created", changes: [] };
  }
  if (!same(info.config.republish, spec.config.republish) && !republishChanges(jsm)) {
    // Servers before 2.10 take a republish only when the stream is made: the stream is kept
    // as it is, and its readers follow its subjects instead (ADR 0066).
    const { republish: _, ...config } = spec.config;
    spec = { ...spec, config };
  }
  if (spec.addsSubjects === true) {
    const subjects = [
      ...new Set([...(info.config.subjects ?? []), ...(spec.config.subjects ?? [])]),
    ];
    spec = { ...spec, config: { ...spec.config, subjects } };
  }
  const changes = differences(spec.config, info.config, spec.settings);
  if (changes.length === 0 || options.existing === "keep")
    return { kind, name, action: "unchanged", changes: [] };
  // A lone server takes a replica count in an update and keeps one copy all the same (2.9), or
  // refuses it (2.15). 2.9 reports no `cluster` for a lone server; 2.15 reports one without a
  // name (only its leader): a cluster's servers always name it.
  if ((spec.config.num_replicas ?? 1) > 1 && info.cluster?.name === undefined) {
    throw new ProvisionError(
      `${label} cannot have ${String(spec.config.num_replicas)} replicas: the nats-server is not part of a cluster; set ${REPLICAS_SETTING}=1 or run on a cluster`,
      name,
    );
  }
  if (options.dryRun !== true) {
    try {
      if (spec.addsSubjects === true) await updateAddingSubjects(jsm, spec, wanted);
      else {
        const { name: stream, ...config } = spec.config;
        await jsm.streams.update(stream, config);
      }
    } catch (err) {
      throw new ProvisionError(
        `${label} differs from the configuration (${describe(changes)}) and the server refused to update it (${reason(err)}): run \`toolmesh setup\` with credentials that may manage streams${hintFor(err)}`,
        name,
        { cause: err },
      );
    }
  }
  return { kind, name, action: "updated", changes };
}

/** Updates before giving up on a stream whose added subjects others keep replacing. */
const ADDED_SUBJECTS_ROUNDS = 10;

/**
 * Updates a stream that keeps the subjects others add ({@link StreamSpec.addsSubjects}): each
 * round writes the subjects it has, the configuration's, and those of the streams listed now
 * ({@link StreamSpec.addsSubjectsFor}), then reads the stream back and lists again, until nothing
 * is missing. A concurrent update that read the stream before this one and lost a subject is
 * caught by the read back of this one or of that one (each lists after it wrote), so the
 * subjects converge to every stream's.
 */
async function updateAddingSubjects(
  jsm: JetStreamManager,
  spec: StreamSpec,
  wanted: StreamSpec,
): Promise<void> {
  const { name: stream, ...config } = spec.config;
  const listed = async (): Promise<string[]> => {
    const names: string[] = [];
    for (const of of wanted.addsSubjectsFor ?? []) {
      // Who may not list streams may not update this one either: the update says so.
      try {
        for await (const name of jsm.streams.names(of.streams))
          names.push(of.subject.replace("{stream}", name));
      } catch {
        return [];
      }
    }
    return names;
  };
  let has = config.subjects ?? [];
  let others = await listed();
  for (let round = 1; ; round++) {
    const subjects = [...new Set([...has, ...(wanted.config.subjects ?? []), ...others])];
    await jsm.streams.update(stream, { ...config, subjects });
    has = (await jsm.streams.info(stream)).config.subjects ?? [];
    others = await listed();
    const missing = [...(wanted.config.subjects ?? []), ...others].filter((s) => !has.includes(s));
    if (missing.length === 0) return;
    if (round === ADDED_SUBJECTS_ROUNDS)
      throw new Error(
        `concurrent updates removed ${missing.join(", ")} ${ADDED_SUBJECTS_ROUNDS} times in a row`,
      );
  }
}

// What the operator must do when even `toolmesh setup` cannot make the change.
function hintFor(err: unknown): string {
  const text = reason(err);
  if (/replicas > 1 not supported in non-clustered mode/i.test(text))
    return `, or set ${REPLICAS_SETTING}=1 for a server that is not part of a cluster`;
  if (/peer offline/i.test(text))
    return `, or start the cluster's JetStream server that is offline (it was waited for ${PEER_OFFLINE_WAIT_MS / 1_000} s)`;
  if (/insufficient resources|no suitable peers/i.test(text))
    return `, or set ${REPLICAS_SETTING} to at most the number of JetStream servers in the cluster`;
  if (/can not change|cannot change|can not be changed/i.test(text))
    return "; if it is the setting named here, back the stream up and delete it first (`nats stream rm`)";
  return "";
}

/** Creates, updates or leaves alone one durable consumer; see the module comment. */
export async function ensureConsumer(
  jsm: JetStreamManager,
  spec: ConsumerSpec,
  options: EnsureOptions = {},
): Promise<ProvisionChange> {
  const name = `${spec.stream}/${spec.name}`;
  const info: ConsumerInfo | undefined = await readOrUndefined(
    jsm.consumers.info(spec.stream, spec.name),
    JsApiCode.ConsumerNotFound,
  ).catch((err: unknown) => {
    throw new ProvisionError(
      `cannot read consumer ${name}: ${reason(err)}; this service needs permission for $JS.API.CONSUMER.INFO.${spec.stream}.${spec.name}`,
      name,
      { cause: err },
    );
  });
  if (info === undefined) {
    if (options.dryRun !== true) {
      try {
        await whilePeerOffline(() => jsm.consumers.add(spec.stream, spec.config));
      } catch (err) {
        // Created meanwhile by another replica: check it like an existing one.
        if (err instanceof JetStreamApiError && err.code !== JsApiCode.ConsumerNotFound) {
          const now = await readOrUndefined(
            jsm.consumers.info(spec.stream, spec.name),
            JsApiCode.ConsumerNotFound,
          ).catch(() => undefined);
          if (now !== undefined) return ensureConsumer(jsm, spec, options);
        }
        throw new ProvisionError(
          `consumer ${name} does not exist and cannot be created (${reason(err)}): run \`toolmesh setup\` with credentials that may manage consumers`,
          name,
          { cause: err },
        );
      }
    }
    return { kind: "consumer", name, action: "created", changes: [] };
  }
  const changes = differences(spec.config, info.config, spec.settings);
  if (changes.length === 0 || options.existing === "keep")
    return { kind: "consumer", name, action: "unchanged", changes: [] };
  if (options.dryRun !== true) {
    const updatable = Object.fromEntries(changes.map((c) => [c.field, c.to]));
    try {
      await jsm.consumers.update(spec.stream, spec.name, updatable);
    } catch (err) {
      throw new ProvisionError(
        `consumer ${name} differs from the configuration (${describe(changes)}) and the server refused to update it (${reason(err)}): run \`toolmesh setup\` with credentials that may manage consumers`,
        name,
        { cause: err },
      );
    }
  }
  return { kind: "consumer", name, action: "updated", changes };
}

/**
 * Opens a KV bucket after ensuring its stream (see {@link ensureStream}). Reads go to the
 * stream leader (no direct gets), so a replica that lags never answers a compare-and-set read.
 */
export async function openBucket(
  nc: NatsConnection,
  jsm: JetStreamManager,
  spec: StreamSpec,
  options: EnsureOptions = {},
): Promise<KV> {
  await ensureStream(jsm, spec, options);
  return new Kvm(nc).open(spec.name, { allow_direct: false });
}
