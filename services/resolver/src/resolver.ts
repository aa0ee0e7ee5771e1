import type { NatsConnection } from "@nats-io/nats-core";
import type { JetStreamManager, JsMsg } from "@nats-io/jetstream";
import type { Subjects } from "@toolmesh/protocol";
import { Defaults, decodeJson, workOwnerOf } from "@toolmesh/protocol";
import type { RequestServer, StreamLimits, WorkLoop } from "@toolmesh/nats";
import {
  Semaphore,
  ensureConsumer,
  meshPlan,
  serveRequests,
  startWorkLoop,
  warnUnavailable,
} from "@toolmesh/nats";
import { openCallPlane } from "@toolmesh/call-store";
import type { ToolRegistry } from "@toolmesh/registry";
import { ToolCapacity } from "@toolmesh/registry";
import type { Logger, Tracer } from "@toolmesh/telemetry";
import { toolmeshMetrics } from "@toolmesh/telemetry";
import { startControlPlane, startOwnerServices } from "@toolmesh/control-plane";
import type { ControlPlane } from "@toolmesh/control-plane";
import { dryRunRequests, handleCall } from "./handle-call.js";
import type { ResolverDeps, ToolAccessPolicy } from "./handle-call.js";
import { SessionLimits } from "./session-limits.js";
import { QuotaGate } from "./quotas.js";
import { FairShare } from "./fair-share.js";
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
  /** Who may call what: tool groups and agents. Default: every tool open to every session. */
  access?: ToolAccessPolicy;
  /** Whether tenants' quotas are applied (the buckets are created when missing). Default true. */
  quotas?: boolean;
  /** How often quota counts of calls that ended unseen are reconciled, in ms. Default 5 000. */
  quotaReconcileMs?: number;
  /** Replicas of buckets this process creates. Default 1. */
  replicas?: number;
  /**
   * Calls of one tool outstanding in the work stream (waiting or running) before further calls
   * are held for a fair turn among tenants, for every tool; 0 turns fair share off. Default: each
   * tool's capacity as its executors announce it (ADR 0055).
   */
  fairShareWindow?: number | undefined;
  /**
   * How long after its last call of a tool a tenant keeps slots of the window free for its next
   * calls (as many as it lately used, up to its share), in ms; 0 keeps none. Default 1 000.
   */
  fairShareIdleMs?: number;
}

/** The tool a final message names, or undefined when it cannot be read. */
function toolOf(data: Uint8Array): string | undefined {
  try {
    const name = (decodeJson(data) as { name?: unknown } | null)?.name;
    return typeof name === "string" ? name : undefined;
  } catch {
    return undefined;
  }
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
  });
  const limits = new SessionLimits(options.sessionMaxInFlight ?? Defaults.sessionMaxInFlight);
  await ensureConsumer(plane.jsm, meshPlan(subjects, { ackWaitMs }).consumers.resolver);
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

  const fairShareWindow = options.fairShareWindow;
  const capacity =
    fairShareWindow !== undefined
      ? undefined
      : new ToolCapacity({
          nc,
          subjects,
          ownerOf: (tool) => registry.get(tool)?.definition.owner,
          log,
        });
  const fairShare =
    fairShareWindow === 0
      ? undefined
      : new FairShare({
          window:
            capacity === undefined ? (fairShareWindow ?? 0) : (tool) => capacity.windowOf(tool),
          idleMs: options.fairShareIdleMs,
          depth: workDepth(plane.jsm, subjects, registry),
          weightOf: (tenant) => quotas?.view.get(tenant)?.quota.weight ?? 1,
          now: () => plane.clock.now(),
          log,
          heartbeatMs: Math.max(250, Math.floor(ackWaitMs / 3)),
        });
  const control: ControlPlane = await startControlPlane({
    queue: QUEUE,
    nc,
    plane,
    subjects,
    log,
    // The deadline keeper follows every result already: count the sessions' calls from it.
    onResult: (msg) => {
      const settled = subjects.parseResultSubject(msg.subject);
      if (settled === undefined) return;
      limits.settled(settled.address, settled.call);
      quotas?.ended(settled.address.tenant, settled.address.session, settled.call);
      if (fairShare !== undefined) {
        // While calls are held, an ending call may have freed its tool's executor: say which.
        const tool = fairShare.held > 0 ? toolOf(msg.data) : undefined;
        fairShare.ended(
          `${settled.address.tenant}.${settled.address.session}.${settled.call}`,
          tool,
        );
      }
    },
  });
  const stopLoggingQuotas = quotas?.view.onChange((key) => {
    const current = quotas.view.get(key);
    log.info({ quota: key, limits: current?.quota ?? null }, "quota applied");
  });
  const metrics = toolmeshMetrics();
  const stopReportingTenants = metrics.observeTenants(() =>
    quotas === undefined
      ? []
      : [...quotas.countedByTenant()].map(([tenant, inFlight]) => ({
          tenant,
          inFlight,
          queued: fairShare?.heldByTenant().get(tenant) ?? 0,
        })),
  );
  // Executors and bridges in tool owners' accounts register and end their calls through these.
  const owners = startOwnerServices({
    nc,
    subjects,
    plane,
    registry,
    log,
    ackWaitMs,
    streamLimits: options.streamLimits,
  });
  const deps: ResolverDeps = {
    subjects,
    registry,
    log,
    tracer,
    plane,
    control,
    limits,
    quotas,
    fairShare,
    metrics,
    defaultTimeoutMs: options.defaultTimeoutMs ?? Defaults.callTimeoutMs,
    callRetentionMs: options.callRetentionMs ?? Defaults.callRetentionMs,
    access: options.access,
  };

  void (async () => {
    for await (const status of nc.status())
      if (status.type === "reconnect") {
        limits.clear();
        fairShare?.reconnected();
      }
  })();

  const intake = {
    js: plane.js,
    consumer: subjects.resolverConsumer,
    // Shared by both loops: a flood of one tenant's own stream and the mesh's calls stream
    // compete for the same slots.
    slots: new Semaphore(options.concurrency ?? Defaults.resolverConcurrency),
    // Calls wait in the buffer for a slot: keep them owned so a live resolver keeps them.
    heartbeatMs: Math.max(250, Math.floor(ackWaitMs / 3)),
    handle: (msg: JsMsg) => handleCall(deps, msg),
    onError: (err: unknown) => log.error({ err }, "resolver loop error"),
  };
  const loops: WorkLoop[] = await Promise.all([
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

  const rpc: RequestServer = serveRequests({
    nc,
    subject: subjects.allResolveRpc,
    queue: QUEUE,
    ...dryRunRequests(deps),
  });
  const stopWatching = registry.onChange(({ name, tool }) => {
    if (tool === undefined) log.info({ tool: name }, "tool removed");
    else
      log.info(
        { tool: name, revision: tool.revision, owner: tool.definition.owner },
        "tool available",
      );
  });
  log.info({ prefix: subjects.prefix, tools: [...registry.names()] }, "resolver started");

  return {
    async stop(graceMs: number = Defaults.shutdownGraceMs) {
      stopWatching();
      fairShare?.stop();
      capacity?.stop();
      await Promise.all([rpc.stop(graceMs), ...loops.map((loop) => loop.stop(graceMs))]);
      await control.stop(graceMs);
      quotas?.close();
      stopReportingTenants();
      stopLoggingQuotas?.();
      owners.stop();
    },
  };
}
