import type { NatsConnection } from "@nats-io/nats-core";
import type { AuditTrail } from "@toolmesh/audit";
import { EndRecorder } from "@toolmesh/audit";
import { Kvm } from "@nats-io/kv";
import type { JetStreamManager, JsMsg } from "@nats-io/jetstream";
import type { Subjects } from "@toolmesh/protocol";
import { Defaults, workOwnerOf } from "@toolmesh/protocol";
import type { RequestServer, StreamLimits, WorkLoop } from "@toolmesh/nats";
import {
  Semaphore,
  ensureConsumer,
  followStatus,
  meshPlan,
  serveRequests,
  startWorkLoop,
  warnUnavailable,
  heartbeatMsFor,
} from "@toolmesh/nats";
import { openCallPlane } from "@toolmesh/call-store";
import type { MeshCallPlane } from "@toolmesh/call-store";
import type { ToolRegistry } from "@toolmesh/registry";
import { ToolCapacity } from "@toolmesh/registry";
import type { Logger, ToolmeshMetrics, Tracer } from "@toolmesh/telemetry";
import { toolmeshMetrics } from "@toolmesh/telemetry";
import { followedResults, startControlPlane, startOwnerServices } from "@toolmesh/control-plane";
import type { ControlPlane, OwnerServices } from "@toolmesh/control-plane";
import { dryRunRequests, handleCall, routeApproved } from "./handle-call.js";
import { ApprovalDesk } from "./approvals.js";
import type { ResolverDeps, ToolAccessPolicy } from "./handle-call.js";
import type { PolicyDecider } from "@toolmesh/policy";
import { SessionLimits } from "./session-limits.js";
import { QuotaGate } from "./quotas.js";
import { StoredBytes } from "./stored-bytes.js";
import { FairShare } from "./fair-share.js";
import { Admission } from "./admission.js";
import { BytesInFlight } from "./bytes-in-flight.js";
import type { WorkDepth } from "./fair-share.js";

/** The queue group of the resolver replicas: dry runs and the control plane's cancel requests. */
const QUEUE = "toolmesh-resolver";

/** Options of {@link startResolver}. Durations in ms. */
export interface ResolverOptions {
  nc: NatsConnection;
  subjects: Subjects;
  registry: ToolRegistry;
  log: Logger;
  tracer: Tracer;
  /** Budget of a call that sets none, in ms. Default 60 000. */
  defaultTimeoutMs?: number;
  /**
   * How long a delivered call stays owned without a sign of life, in ms: after a resolver
   * crash its calls are redelivered once this passes. Default 10 000.
   */
  ackWaitMs?: number;
  /** Calls resolved at once by this process. Default 64. */
  concurrency?: number;
  /** Calls of one session in flight through this resolver; more get `overloaded`. Default 256. */
  sessionMaxInFlight?: number;
  streamLimits?: StreamLimits;
  /** How long call records are kept (the idempotency horizon), in ms. Default 24 h. */
  callRetentionMs?: number;
  /**
   * Largest result an owner's executor may end a call with, in bytes (`TOOLMESH_MAX_RESULT_BYTES`):
   * the owner services refuse a larger final message. Default 512 KiB.
   */
  maxResultBytes?: number;
  /** Who may call what: tool groups and agents. Default: every tool open to every session. */
  access?: ToolAccessPolicy;
  /** The Cedar policy sets in force (docs/policy.md). Default: no call is decided by policy. */
  policies?: PolicyDecider;
  /**
   * Where every call's life is recorded (ADR 0060); calls are not recorded when undefined. In
   * `required` mode a call whose admission cannot be recorded is refused `unavailable`.
   */
  audit?: AuditTrail | undefined;
  /** Whether tenants' quotas are applied (the buckets are created when missing). Default true. */
  quotas?: boolean;
  /** How often quota counts of calls that ended unseen are reconciled, in ms. Default 5 000. */
  quotaReconcileMs?: number;
  /**
   * Bytes of final messages each tenant's calls may have stored within the call retention,
   * unless its quota says otherwise; 0 bounds none. Default 64 MiB (ADR 0050).
   */
  tenantMaxStoredBytes?: number;
  /** How often this process writes the stored bytes it counted, per tenant, in ms. Default 500. */
  storedFlushMs?: number;
  /** Replicas of buckets this process creates. Default 1. */
  replicas?: number;
  /**
   * Calls of one tool outstanding in the work stream (waiting or running) before further calls
   * are held for a fair turn among tenants, for every tool; 0 turns fair share off. Default
   * `"auto"`: each tool's capacity as its executors announce it (ADR 0055).
   */
  fairShareWindow?: number | "auto" | undefined;
  /**
   * How long after its last call of a tool a tenant keeps slots of the window free for its next
   * calls (as many as it lately used, up to its share), in ms; 0 keeps none. Default 1 000.
   */
  fairShareIdleMs?: number;
  /**
   * Bytes one tenant's calls may have in flight through this resolver (each weighed by its
   * arguments and its tool's recent results) before its further calls wait for its bytes to come
   * down; 0 turns it off. Default `maxResultBytes` (`TOOLMESH_TENANT_MAX_BYTES_IN_FLIGHT`).
   */
  tenantMaxBytesInFlight?: number;
  /**
   * How often this resolver sweeps the calls waiting for approval (expiring those nobody
   * decided in time, routing approved ones a crash left), in ms. Default 1 000.
   */
  approvalSweepMs?: number;
}

/** A tool's outstanding work: its work consumer's undelivered and unacknowledged messages. */
function workDepth(jsm: JetStreamManager, subjects: Subjects, registry: ToolRegistry): WorkDepth {
  return async (tool) => {
    const definition = registry.get(tool)?.definition;
    const stream = subjects.workStream(definition && workOwnerOf(definition));
    const info = await jsm.consumers.info(stream, subjects.workConsumer(tool));
    return info.num_pending + info.num_ack_pending;
  };
}

/** A running resolver. */
export interface Resolver {
  /** Stops taking calls and waits for those in hand (at most `graceMs`, default 10 s). */
  stop(graceMs?: number): Promise<void>;
}

/**
 * Takes calls from the calls stream, resolves them, answers invalid ones on their session at
 * once and routes valid ones to their tool's work subject, after recording them in the call
 * store. Also runs the control plane: deadline keeper, dead-letter
 * keeper, cancellation, dry-run requests, and the owner services (ADR 0031).
 */
export async function startResolver(options: ResolverOptions): Promise<Resolver> {
  const { nc, subjects, registry, log, tracer } = options;
  const ackWaitMs = options.ackWaitMs ?? Defaults.ackWaitMs;
  const plane = await openCallPlane(nc, {
    subjects,
    streamLimits: options.streamLimits,
    callRetentionMs: options.callRetentionMs,
    audit: options.audit,
  });
  await ensureConsumer(plane.jsm, meshPlan(subjects, { ackWaitMs }).consumers.resolver);
  const metrics = toolmeshMetrics();
  const admission = await openAdmission(options, plane, ackWaitMs, metrics);
  const control = await startResolverControl(options, plane, admission);
  const stopReportingQuotas = reportQuotas(admission, metrics, log);
  // Executors and bridges in tool owners' accounts register and end their calls through these.
  const owners = startOwnerServices({
    nc,
    subjects,
    plane,
    registry,
    log,
    ackWaitMs,
    streamLimits: options.streamLimits,
    maxResultBytes: options.maxResultBytes,
  });
  const approvals = await openApprovals(options, plane, metrics);
  const ends = await recordEnds(options, metrics);
  const deps: ResolverDeps = {
    subjects,
    registry,
    log,
    tracer,
    plane,
    control,
    admission,
    metrics,
    defaultTimeoutMs: options.defaultTimeoutMs ?? Defaults.callTimeoutMs,
    callRetentionMs: options.callRetentionMs ?? Defaults.callRetentionMs,
    access: options.access,
    policies: options.policies,
    audit: options.audit,
    approvals,
  };
  approvals.start((call, argsHash) => routeApproved(deps, call, argsHash, call.resolved_at));

  const stopFollowing = followStatus(nc, { reconnect: () => admission.reconnected() });

  const loops = await startIntake(deps, options, ackWaitMs);

  const rpc: RequestServer = serveRequests({
    nc,
    subject: subjects.allResolveRpc,
    queue: QUEUE,
    ...dryRunRequests(deps),
    // A dry run carries a call: it may be as large as a call the calls stream takes.
    maxRequestBytes: options.streamLimits?.maxMessageBytes ?? Defaults.maxMessageBytes,
  });
  const stopLogging = registry.logChanges(log);
  const stopWatching = (): void => {
    stopLogging();
    stopFollowing();
  };
  log.info({ prefix: subjects.prefix, tools: [...registry.names()] }, "resolver started");

  return new RunningResolver({
    admission,
    control,
    approvals,
    owners,
    loops,
    rpc,
    ends,
    stopWatching,
    stopReportingQuotas,
  });
}

/**
 * With a trail, records every final message the sessions stream stores as its call's end (ADR
 * 0068); started once that stream exists.
 */
async function recordEnds(
  { nc, subjects, audit, log }: ResolverOptions,
  metrics: ToolmeshMetrics,
): Promise<EndRecorder | undefined> {
  if (audit === undefined) return undefined;
  return EndRecorder.start(nc, subjects, audit, log.child({ part: "audit" }), {
    observer: metrics,
  });
}

/** What a running resolver started, and stops in turn. */
interface ResolverParts {
  admission: Admission;
  control: ControlPlane;
  approvals: ApprovalDesk;
  owners: OwnerServices;
  loops: WorkLoop[];
  rpc: RequestServer;
  ends: EndRecorder | undefined;
  stopWatching: () => void;
  stopReportingQuotas: () => void;
}

/** A running resolver ({@link startResolver}): the parts it started are its fields. */
class RunningResolver implements Resolver {
  readonly #admission: Admission;
  readonly #control: ControlPlane;
  readonly #approvals: ApprovalDesk;
  readonly #owners: OwnerServices;
  readonly #loops: WorkLoop[];
  readonly #rpc: RequestServer;
  readonly #ends: EndRecorder | undefined;
  readonly #stopWatching: () => void;
  readonly #stopReportingQuotas: () => void;

  constructor(parts: ResolverParts) {
    this.#admission = parts.admission;
    this.#control = parts.control;
    this.#approvals = parts.approvals;
    this.#owners = parts.owners;
    this.#loops = parts.loops;
    this.#rpc = parts.rpc;
    this.#ends = parts.ends;
    this.#stopWatching = parts.stopWatching;
    this.#stopReportingQuotas = parts.stopReportingQuotas;
  }

  async stop(graceMs: number = Defaults.shutdownGraceMs): Promise<void> {
    this.#stopWatching();
    this.#admission.stop();
    await this.#approvals.stop(graceMs);
    await Promise.all([
      this.#rpc.stop(graceMs),
      this.#owners.stop(graceMs),
      ...this.#loops.map((loop) => loop.stop(graceMs)),
    ]);
    // After the calls in hand: their ends are recorded by then, or come back to another resolver.
    await this.#ends?.stop(graceMs);
    await this.#control.stop(graceMs);
    this.#admission.quotas?.close();
    await this.#admission.stored?.close();
    this.#stopReportingQuotas();
  }
}

/** The control plane of this resolver, whose view of the results settles admitted calls. */
function startResolverControl(
  options: ResolverOptions,
  plane: MeshCallPlane,
  admission: Admission,
): Promise<ControlPlane> {
  const { nc, subjects, registry, log } = options;
  return startControlPlane({
    queue: QUEUE,
    nc,
    plane,
    subjects,
    log,
    workStreamOf: (tool) => {
      const definition = registry.get(tool)?.definition;
      return subjects.workStream(definition && workOwnerOf(definition));
    },
    // The deadline keeper follows every result already: settle admitted calls from it.
    onResult: (result) => {
      const settled = subjects.parseResultSubject(result.subject);
      if (settled !== undefined)
        admission.settle(settled.address, settled.call, result.tool, result.bytes);
    },
  });
}

/** Where this resolver keeps the calls waiting for approval (ADR 0059). */
function openApprovals(
  options: ResolverOptions,
  plane: MeshCallPlane,
  metrics: ToolmeshMetrics,
): Promise<ApprovalDesk> {
  return ApprovalDesk.open({
    nc: options.nc,
    subjects: options.subjects,
    plane,
    registry: options.registry,
    policies: options.policies,
    log: options.log,
    metrics,
    callRetentionMs: options.callRetentionMs ?? Defaults.callRetentionMs,
    replicas: options.replicas,
    sweepMs: options.approvalSweepMs,
    audit: options.audit,
  });
}

/** The session slots, quota gate and fair share of this resolver, as one {@link Admission}. */
async function openAdmission(
  options: ResolverOptions,
  plane: MeshCallPlane,
  ackWaitMs: number,
  metrics: ToolmeshMetrics,
): Promise<Admission> {
  const { nc, subjects, registry, log } = options;
  const limits = new SessionLimits(options.sessionMaxInFlight ?? Defaults.sessionMaxInFlight);
  const quotas =
    options.quotas === false
      ? undefined
      : await QuotaGate.open(nc, {
          subjects,
          log,
          replicas: options.replicas,
          reconcileMs: options.quotaReconcileMs,
          now: () => plane.clock.now(),
        });
  const stored =
    quotas === undefined
      ? undefined
      : await StoredBytes.open({
          nc,
          subjects,
          results: await followedResults({ plane, subjects }),
          usage: await new Kvm(nc).open(subjects.quotaUsageBucket),
          boundOf: (tenant) => quotas.view.get(tenant)?.quota.max_stored_bytes,
          defaultBound: options.tenantMaxStoredBytes ?? Defaults.tenantMaxStoredBytes,
          windowMs: Math.max(
            options.callRetentionMs ?? Defaults.callRetentionMs,
            Defaults.sessionRetentionMs,
          ),
          ...(options.storedFlushMs === undefined ? {} : { flushMs: options.storedFlushMs }),
          now: () => plane.clock.now(),
          log,
        });

  const fairShareWindow = options.fairShareWindow ?? "auto";
  const capacity =
    fairShareWindow !== "auto"
      ? undefined
      : new ToolCapacity({
          nc,
          subjects,
          ownerOf: (tool) => registry.get(tool)?.definition.owner,
          log,
        });
  const maxBytes =
    options.tenantMaxBytesInFlight ?? options.maxResultBytes ?? Defaults.maxResultBytes;
  const bytesInFlight = maxBytes > 0 ? new BytesInFlight({ maxPerTenant: maxBytes }) : undefined;
  // Bytes in flight hold calls on the fair-share path: with the window off, no tool is busy.
  const fairShare =
    fairShareWindow === 0 && bytesInFlight === undefined
      ? undefined
      : new FairShare({
          window:
            typeof fairShareWindow === "number"
              ? fairShareWindow
              : (tool) => capacity?.windowOf(tool) ?? 0,
          idleMs: options.fairShareIdleMs,
          depth: workDepth(plane.jsm, subjects, registry),
          weightOf: (tenant) => quotas?.view.get(tenant)?.quota.weight ?? 1,
          now: () => plane.clock.now(),
          log,
          heartbeatMs: heartbeatMsFor(ackWaitMs),
          gate: bytesInFlight,
        });
  return new Admission({ limits, quotas, stored, fairShare, capacity, bytesInFlight, metrics });
}

/** Logs every quota applied and reports the tenants' calls in flight; returns how to stop. */
function reportQuotas(admission: Admission, metrics: ToolmeshMetrics, log: Logger): () => void {
  const { quotas, fairShare } = admission;
  const stopLogging = quotas?.view.onChange((key) => {
    const current = quotas.view.get(key);
    log.info({ quota: key, limits: current?.quota ?? null }, "quota applied");
  });
  const stopReportingStored = admission.stored
    ? metrics.observeStoredResults(() => admission.stored?.readings() ?? [])
    : undefined;
  const stopReporting = metrics.observeTenants(() =>
    quotas === undefined
      ? []
      : [...quotas.countedByTenant()].map(([tenant, inFlight]) => ({
          tenant,
          inFlight,
          queued: fairShare?.heldByTenant().get(tenant) ?? 0,
        })),
  );
  return () => {
    stopReporting();
    stopReportingStored?.();
    stopLogging?.();
  };
}

/** The two loops that take calls: the mesh's calls stream, and every tenant's own. */
function startIntake(
  deps: ResolverDeps,
  options: ResolverOptions,
  ackWaitMs: number,
): Promise<WorkLoop[]> {
  const { subjects, log, plane } = deps;
  const intake = {
    js: plane.js,
    consumer: subjects.resolverConsumer,
    // Shared by both loops: a flood of one tenant's own stream and the mesh's calls stream
    // compete for the same slots.
    slots: new Semaphore(options.concurrency ?? Defaults.resolverConcurrency),
    // Calls wait in the buffer for a slot: keep them owned so a live resolver keeps them.
    heartbeatMs: heartbeatMsFor(ackWaitMs),
    handle: (msg: JsMsg) => handleCall(deps, msg),
    onError: (err: unknown) => log.error({ err }, "resolver loop error"),
  };
  return Promise.all([
    startWorkLoop({
      ...intake,
      stream: subjects.streams.calls,
      maxMessages: 32,
      onConsumerUnavailable: warnUnavailable(log, subjects.resolverConsumer),
    }),
    // Every tenant's own calls stream (ADR 0048) pushes into one queue group: one subscription
    // however many tenants, and a tenant's stream made later is read with no restart.
    startWorkLoop({
      ...intake,
      stream: `${subjects.streams.calls}_*`,
      push: { deliverSubject: subjects.intake, deliverGroup: subjects.resolverConsumer },
    }),
  ]);
}
