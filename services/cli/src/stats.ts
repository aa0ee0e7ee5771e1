import type { NatsConnection } from "@nats-io/nats-core";
import type { ConsumerInfo } from "@nats-io/jetstream";
import type { JetStreamManager } from "@nats-io/jetstream";
import { jetstreamManager } from "@nats-io/jetstream";
import type { StatsReply, Subjects } from "@toolmesh/protocol";
import { StatsReplySchema, decodeJsonOrUndefined, subjectToken } from "@toolmesh/protocol";
import { ATTR_TOOLMESH_QUOTA, ATTR_TOOLMESH_TENANT, MetricName } from "@toolmesh/telemetry";
import type { StreamUsage } from "./storage-stats.js";
import type { StoredResultsOptions } from "./storage-stats.js";
import { readStorage, readStoredResults } from "./storage-stats.js";

/** Everything `toolmesh stats` knows about one tool, summed over every process. */
export interface ToolStats {
  tool: string;
  /** Calls ended by executors, by outcome (`ok` or the error code). */
  calls: Record<string, number>;
  /** Calls the resolvers answered with an error before any executor, by error code. */
  rejected: Record<string, number>;
  /** Failed calls (ended or rejected) over all calls; 0 without calls. */
  error_rate: number;
  attempts: number;
  retries: number;
  timeouts: number;
  /** Median and 99th percentile of acceptance → final message, in ms (bucket estimates). */
  p50_ms: number | undefined;
  p99_ms: number | undefined;
  in_flight: number;
  /**
   * From the tool's JetStream consumers, on the mesh's work stream and every tool owner's (ADR
   * 0041), summed: waiting (lag), delivered and unacknowledged.
   */
  queue: { pending: number; ack_pending: number } | undefined;
  /** Executor processes serving the tool now. */
  executors: number;
}

/** One process that answered. */
export interface ServiceStats {
  service: string;
  instance: string;
  started_at: number;
}

/** What the resolvers count of one tenant with a quota (its subject token), summed over them. */
export interface TenantStats {
  tenant: string;
  /** Calls accepted and not ended. */
  in_flight: number;
  /** Of those, calls held for their fair turn at a busy tool. */
  queued: number;
  /** Calls its quotas refused, by `{code}:{quota}` (e.g. `quota_exceeded:max_in_flight`). */
  refused: Record<string, number>;
  /**
   * Its calls stored in the calls stream now — not yet read by a resolver, or held for a fair
   * turn — from the server, for every tenant (with a quota or not); in how many sessions, and
   * the most of one session (the server refuses a session past TOOLMESH_MAX_QUEUED_CALLS_PER_SESSION).
   */
  stored: { calls: number; sessions: number; max_session: number };
}

/** What `toolmesh stats --json` prints. */
export interface MeshStats {
  at: number;
  services: ServiceStats[];
  tools: ToolStats[];
  resolver: { resolved: number; rejected: Record<string, number> };
  dead_letters: number;
  schema: { expansions: number; sessions: number };
  /** Tenants with a quota or with calls stored in the calls stream, by token. */
  tenants: TenantStats[];
  /** Every stream's bytes against its bound: the mesh's, each tenant's and each owner's. */
  storage: StreamUsage[];
  mcp_servers: {
    server: string;
    /** The state each replica reports, e.g. `{ "ready": 2 }`. */
    states: Record<string, number>;
    restarts: number;
    requests: number;
    p50_ms: number | undefined;
    p99_ms: number | undefined;
  }[];
}

type Metric = StatsReply["metrics"][number];
type Point = Metric["points"][number];

const TOOL = "gen_ai.tool.name";
const ERROR = "error.type";
const SERVER = "toolmesh.mcp.server";
const TENANT = ATTR_TOOLMESH_TENANT;
const QUOTA = ATTR_TOOLMESH_QUOTA;

/**
 * Asks every toolmesh process for its metrics on the stats subject (each answers; the request
 * ends once answers stop coming for `stallMs`) and reads each tool's work consumers from
 * JetStream. Tools appear when any process or the registry knows them.
 */
export async function gatherStats(
  nc: NatsConnection,
  subjects: Subjects,
  tools: readonly string[],
  options: {
    maxWaitMs?: number;
    stallMs?: number;
    tenant?: string;
    /** How to read tenants' stored results; left out: not read. */
    stored?: StoredResultsOptions;
  } = {},
): Promise<MeshStats> {
  const replies: StatsReply[] = [];
  try {
    const answers = await nc.requestMany(subjects.stats, undefined, {
      strategy: "stall",
      stall: options.stallMs ?? 300,
      maxWait: options.maxWaitMs ?? 2_000,
    });
    for await (const msg of answers) {
      const parsed = StatsReplySchema.safeParse(decodeJsonOrUndefined(msg.data));
      if (parsed.success) replies.push(parsed.data);
    }
  } catch {
    // No process answered (no responders): the stats say so by listing none.
  }
  const consumers = await readConsumers(nc, subjects);
  const stored = await readStoredCalls(nc, subjects, options.tenant);
  const jsm = await jetstreamManager(nc).catch(() => undefined);
  const storage = [
    ...(jsm === undefined ? [] : await readStorage(jsm, subjects)),
    ...(options.stored === undefined ? [] : await readStoredResults(nc, subjects, options.stored)),
  ];
  const stats = {
    ...summarize(replies, tools, (tool) => consumers.get(subjects.workConsumer(tool)), stored),
    storage,
  };
  if (options.tenant === undefined) return stats;
  const token = subjectToken(options.tenant);
  return {
    ...stats,
    tenants: stats.tenants.filter((t) => t.tenant === token),
    storage: storage.filter((u) => u.of === "mesh" || (u.of === "tenant" && u.id === token)),
  };
}

/**
 * Calls stored per session subject, read from the servers' stream info: the mesh's calls stream
 * (`{p}.v1.calls.{tenant}.{session}`) and every tenant's own (`{p}.v1.tenant-calls.…`, ADR 0048,
 * listed where this user may list streams); one tenant's subjects only when `tenant` is given.
 */
async function readStoredCalls(
  nc: NatsConnection,
  subjects: Subjects,
  tenant: string | undefined,
): Promise<Record<string, number>> {
  const jsm = await jetstreamManager(nc).catch(() => undefined);
  if (jsm === undefined) return {};
  const read = async (stream: string, filter: string): Promise<Record<string, number>> => {
    try {
      return (await jsm.streams.info(stream, { subjects_filter: filter })).state.subjects ?? {};
    } catch {
      // No such stream (yet): nothing stored.
      return {};
    }
  };
  const tenantStreams: string[] = [];
  if (tenant !== undefined) tenantStreams.push(subjects.callsStream(tenant));
  else {
    try {
      for await (const name of jsm.streams.names(subjects.allTenantStreamCalls))
        tenantStreams.push(name);
    } catch {
      // Not allowed to list streams: the mesh's calls stream only.
    }
  }
  const stored = await Promise.all([
    read(
      subjects.streams.calls,
      tenant === undefined ? subjects.allCalls : subjects.tenantCalls(tenant),
    ),
    ...tenantStreams.map((stream) => read(stream, subjects.allTenantStreamCalls)),
  ]);
  return Object.assign({}, ...stored) as Record<string, number>;
}

/** A work consumer's queue: waiting, and delivered but unacknowledged. */
export type QueueFigures = Pick<ConsumerInfo, "num_pending" | "num_ack_pending">;

/**
 * The work streams: the mesh's and every tool owner's (ADR 0041). An owner's are listed only
 * where the server lets this user list streams (`toolmesh auth config` lets the operator).
 */
export async function workStreams(jsm: JetStreamManager, subjects: Subjects): Promise<string[]> {
  const streams = [subjects.streams.work];
  try {
    for await (const name of jsm.streams.names(subjects.allOwnerWork)) streams.push(name);
  } catch {
    // Not allowed to list streams: the mesh's work stream only.
  }
  return streams;
}

/** Every work consumer's queue by consumer name, summed over the work streams that have it. */
async function readConsumers(
  nc: NatsConnection,
  subjects: Subjects,
): Promise<Map<string, QueueFigures>> {
  const byName = new Map<string, QueueFigures>();
  const jsm = await jetstreamManager(nc).catch(() => undefined);
  if (jsm === undefined) return byName; // no JetStream here: no queues
  for (const stream of await workStreams(jsm, subjects)) {
    try {
      for await (const info of jsm.consumers.list(stream)) {
        const seen = byName.get(info.name) ?? { num_pending: 0, num_ack_pending: 0 };
        byName.set(info.name, {
          num_pending: seen.num_pending + info.num_pending,
          num_ack_pending: seen.num_ack_pending + info.num_ack_pending,
        });
      }
    } catch {
      // No such stream yet (or none readable): no queues there.
    }
  }
  return byName;
}

/** Every metric point of one name, over the processes' replies. */
type PointsOf = (name: string) => Point[];

/** Each tool's calls, outcomes, latency and queue, registered or seen in the metrics. */
function toolStats(
  all: PointsOf,
  registered: readonly string[],
  consumerOf: (tool: string) => QueueFigures | undefined,
): ToolStats[] {
  const calls = all(MetricName.ToolCalls);
  const rejections = all(MetricName.ResolverCalls);
  const durations = all(MetricName.ToolCallDuration);
  const toolNames = new Set<string>(registered);
  for (const point of [...calls, ...all(MetricName.ToolExecutors), ...all(MetricName.ToolAttempts)])
    if (typeof point.attributes[TOOL] === "string") toolNames.add(point.attributes[TOOL]);

  return [...toolNames].sort().map((tool): ToolStats => {
    const mine = (points: Point[]) => points.filter((p) => p.attributes[TOOL] === tool);
    const byOutcome = countBy(mine(calls), (p) => String(p.attributes[ERROR] ?? "ok"));
    const rejected = countBy(
      mine(rejections).filter((p) => p.attributes["toolmesh.resolution"] === "rejected"),
      (p) => String(p.attributes[ERROR]),
    );
    const ended = sum(Object.values(byOutcome));
    const refused = sum(Object.values(rejected));
    const failed = ended - (byOutcome.ok ?? 0) + refused;
    const histogram = mergeHistograms(mine(durations));
    const consumer = consumerOf(tool);
    return {
      tool,
      calls: byOutcome,
      rejected,
      error_rate: ended + refused === 0 ? 0 : failed / (ended + refused),
      attempts: total(mine(all(MetricName.ToolAttempts))),
      retries: total(mine(all(MetricName.ToolRetries))),
      timeouts: total(mine(all(MetricName.ToolTimeouts))),
      p50_ms: quantileMs(histogram, 0.5),
      p99_ms: quantileMs(histogram, 0.99),
      in_flight: total(mine(all(MetricName.ToolInFlight))),
      queue:
        consumer === undefined
          ? undefined
          : { pending: consumer.num_pending, ack_pending: consumer.num_ack_pending },
      executors: total(mine(all(MetricName.ToolExecutors))),
    };
  });
}

/** Each MCP server's states, restarts and request latency. */
function mcpServerStats(all: PointsOf): MeshStats["mcp_servers"] {
  const servers = new Set<string>();
  for (const point of all(MetricName.McpServerState))
    if (typeof point.attributes[SERVER] === "string") servers.add(point.attributes[SERVER]);
  return [...servers].sort().map((server) => {
    const mine = (points: Point[]) => points.filter((p) => p.attributes[SERVER] === server);
    const states = countBy(
      mine(all(MetricName.McpServerState)).filter((p) => p.value === 1),
      (p) => String(p.attributes["toolmesh.mcp.state"]),
    );
    const histogram = mergeHistograms(mine(all(MetricName.McpRequestDuration)));
    return {
      server,
      states,
      restarts: total(mine(all(MetricName.McpServerRestarts))),
      requests: histogram?.count ?? 0,
      p50_ms: quantileMs(histogram, 0.5),
      p99_ms: quantileMs(histogram, 0.99),
    };
  });
}

/** Each tenant's calls in flight, queued and refused, and what its sessions store. */
function tenantStats(all: PointsOf, storedCalls: Readonly<Record<string, number>>): TenantStats[] {
  const tenantNames = new Set<string>();
  const tenantPoints = [
    ...all(MetricName.TenantInFlight),
    ...all(MetricName.TenantQueued),
    ...all(MetricName.TenantRefused),
  ];
  for (const point of tenantPoints)
    if (typeof point.attributes[TENANT] === "string") tenantNames.add(point.attributes[TENANT]);
  // `{p}.v1.calls.{tenant}.{session}`, `{p}.v1.tenant-calls.{tenant}.{session}`: the tenant is
  // the next to last token.
  const stored = new Map<string, TenantStats["stored"]>();
  for (const [subject, count] of Object.entries(storedCalls)) {
    const tenant = subject.split(".").at(-2);
    if (tenant === undefined || count === 0) continue;
    tenantNames.add(tenant);
    const s = stored.get(tenant) ?? { calls: 0, sessions: 0, max_session: 0 };
    stored.set(tenant, {
      calls: s.calls + count,
      sessions: s.sessions + 1,
      max_session: Math.max(s.max_session, count),
    });
  }
  return [...tenantNames].sort().map((tenant): TenantStats => {
    const mine = (points: Point[]) => points.filter((p) => p.attributes[TENANT] === tenant);
    return {
      tenant,
      in_flight: total(mine(all(MetricName.TenantInFlight))),
      queued: total(mine(all(MetricName.TenantQueued))),
      refused: countBy(
        mine(all(MetricName.TenantRefused)),
        (p) => `${String(p.attributes[ERROR])}:${String(p.attributes[QUOTA])}`,
      ),
      stored: stored.get(tenant) ?? { calls: 0, sessions: 0, max_session: 0 },
    };
  });
}

/** Sums the processes' metrics per tool, MCP server and service. */
export function summarize(
  replies: readonly StatsReply[],
  registered: readonly string[],
  consumerOf: (tool: string) => QueueFigures | undefined,
  storedCalls: Readonly<Record<string, number>> = {},
): MeshStats {
  const all = (name: string): Point[] =>
    replies.flatMap((r) => r.metrics.filter((m) => m.name === name).flatMap((m) => m.points));
  const resolverPoints = all(MetricName.ResolverCalls);
  return {
    at: Date.now(),
    tenants: tenantStats(all, storedCalls),
    // Read from the server by gatherStats, not from the processes' metrics.
    storage: [],
    services: replies
      .map((r) => ({ service: r.service, instance: r.instance, started_at: r.started_at }))
      .sort((a, b) => a.service.localeCompare(b.service) || a.instance.localeCompare(b.instance)),
    tools: toolStats(all, registered, consumerOf),
    resolver: {
      resolved: total(
        resolverPoints.filter((p) => p.attributes["toolmesh.resolution"] === "resolved"),
      ),
      rejected: countBy(
        resolverPoints.filter((p) => p.attributes["toolmesh.resolution"] === "rejected"),
        (p) => String(p.attributes[ERROR]),
      ),
    },
    dead_letters: total(all(MetricName.DeadLetters)),
    schema: {
      expansions: total(all(MetricName.SchemaExpansions)),
      sessions: total(all(MetricName.SchemaSessions)),
    },
    mcp_servers: mcpServerStats(all),
  };
}

function countBy(points: Point[], key: (p: Point) => string): Record<string, number> {
  const counts: Record<string, number> = {};
  for (const point of points) {
    const k = key(point);
    counts[k] = (counts[k] ?? 0) + (point.value ?? 0);
  }
  return counts;
}

function total(points: Point[]): number {
  return sum(points.map((p) => p.value ?? 0));
}

function sum(values: number[]): number {
  return values.reduce((a, b) => a + b, 0);
}

interface Histogram {
  boundaries: number[];
  counts: number[];
  count: number;
}

/** Adds histograms with the same boundaries (toolmesh uses one set); others are skipped. */
function mergeHistograms(points: Point[]): Histogram | undefined {
  let merged: Histogram | undefined;
  for (const { histogram } of points) {
    if (histogram === undefined) continue;
    if (merged === undefined) {
      merged = {
        boundaries: histogram.boundaries,
        counts: [...histogram.counts],
        count: histogram.count,
      };
    } else if (merged.boundaries.join() === histogram.boundaries.join()) {
      histogram.counts.forEach((c, i) => (merged!.counts[i] = (merged!.counts[i] ?? 0) + c));
      merged.count += histogram.count;
    }
  }
  return merged;
}

/**
 * The `q` quantile of a histogram in ms, interpolated linearly inside its bucket (as
 * Prometheus' `histogram_quantile` does); the last, open bucket answers its lower bound.
 */
export function quantileMs(histogram: Histogram | undefined, q: number): number | undefined {
  if (histogram === undefined || histogram.count === 0) return undefined;
  const rank = q * histogram.count;
  let seen = 0;
  for (let i = 0; i < histogram.counts.length; i++) {
    const inBucket = histogram.counts[i] ?? 0;
    if (seen + inBucket >= rank && inBucket > 0) {
      const lower = i === 0 ? 0 : (histogram.boundaries[i - 1] ?? 0);
      const upper = histogram.boundaries[i];
      if (upper === undefined) return lower * 1000;
      return (lower + ((upper - lower) * (rank - seen)) / inBucket) * 1000;
    }
    seen += inBucket;
  }
  return undefined;
}
