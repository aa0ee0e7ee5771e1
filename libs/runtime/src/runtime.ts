import { hostname } from "node:os";
import { AuditTrail, serveAuditWrites, settleAudit } from "@toolmesh/audit";
import type { AddressInfo } from "node:net";
import type { NatsConnection, Subscription } from "@nats-io/nats-core";
import pRetry from "p-retry";
import type { Subjects } from "@toolmesh/protocol";
import { ToolmeshError, createSubjects, settledWithin, subjectToken } from "@toolmesh/protocol";
import type { MeshSettings, StreamLimits } from "@toolmesh/nats";
import {
  assertServerSupported,
  connectNats,
  retryWhileUnavailable,
  warnUnavailable,
} from "@toolmesh/nats";
import { ToolRegistry } from "@toolmesh/registry";
import type { Logger, Metrics, Telemetry, Tracer } from "@toolmesh/telemetry";
import {
  createLogger,
  initMetrics,
  initTelemetry,
  serviceNameOf,
  setPayloadRecording,
  toolmeshMetrics,
} from "@toolmesh/telemetry";
import type { RuntimeConfig } from "./config.js";
import { loadConfig } from "./config.js";
import { ConnectionWatch } from "./connection-watch.js";
import { Readiness, startHealthServer } from "./health.js";
import { answerStats } from "./stats.js";

/** What every actor needs: one connection, one logger, one tracer, the live registry. */
export interface Runtime {
  readonly config: RuntimeConfig;
  readonly nc: NatsConnection;
  readonly subjects: Subjects;
  /**
   * The live registry; undefined for an executor or bridge in a tool owner's account
   * (`TOOLMESH_OWNER`), which reaches the mesh only through its owner services.
   */
  readonly registry: ToolRegistry | undefined;
  readonly log: Logger;
  readonly tracer: Tracer;
  readonly telemetry: Telemetry;
  /** The process's metrics (Prometheus `/metrics`, OTLP, the stats subject). */
  readonly metrics: Metrics;
  /** The checks behind `/readyz`; actors add their own (`rt.readiness.set(name, check)`). */
  readonly readiness: Readiness;
  readonly streamLimits: StreamLimits;
  /** Whether the NATS connection is up right now (false while reconnecting). */
  connected(): boolean;
  /**
   * Whether the process is alive: its connection is open and has not been down for longer than
   * `livenessDisconnectedMs` (`/healthz`).
   */
  alive(): boolean;
  /** Runs `task` when the runtime closes, before the connection drains (a service's last writes). */
  onClose(task: () => Promise<void>): void;
  /** Runs the tasks of {@link onClose}, drains the connection and flushes telemetry. */
  close(): Promise<void>;
}

/** What shapes the streams, buckets and shared consumers, as configured. */
export function meshSettings(config: RuntimeConfig): MeshSettings {
  return {
    maxMessageBytes: config.maxMessageBytes,
    duplicateWindowMs: config.duplicateWindowMs,
    maxQueuedCalls: config.maxQueuedCalls,
    maxQueuedCallsPerSession: config.maxQueuedCallsPerSession,
    maxQueuedCallsPerTenant: config.maxQueuedCallsPerTenant,
    storeBytes: config.storeBytes,
    tenantStoreBytes: config.tenantStoreBytes,
    ownerStoreBytes: config.ownerStoreBytes,
    auditRetentionMs: config.auditRetentionMs,
    maxDeadLetters: config.maxDeadLetters,
    replicas: config.streamReplicas,
    compression: config.streamCompression,
    republishHeads: config.republishHeads,
    callRetentionMs: config.callRetentionMs,
    sessionStateTtlMs: config.sessionStateTtlMs,
    ackWaitMs: config.ackWaitMs,
  };
}

/** Options of {@link openRuntime}. Durations in ms. */
export interface OpenRuntimeOptions {
  /**
   * Keep trying to reach NATS for this long, with backoff, logging each failed attempt, before
   * giving up with a {@link StartupTimeoutError}. Default 0: one attempt.
   */
  retryForMs?: number;
  /** The readiness checks to add to (served before the runtime exists); default new ones. */
  readiness?: Readiness;
}

/** NATS could not be reached within the start-up budget; the message says what to do. */
export class StartupTimeoutError extends Error {
  override readonly name = "StartupTimeoutError";
}

/**
 * Connects (trying again for `retryForMs`), checks the server, opens the registry and starts
 * telemetry for one process.
 */
export async function openRuntime(
  config: RuntimeConfig,
  service: string,
  log?: Logger,
  options: OpenRuntimeOptions = {},
): Promise<Runtime> {
  const logger = log ?? createLogger({ service, level: config.logLevel });
  const serviceName = `toolmesh-${service}`;
  const telemetry = initTelemetry({ serviceName, env: config.env });
  setPayloadRecording(config.tracePayloads);
  const subjects = createSubjects({ prefix: config.prefix });
  const owner = ownerAccountOf(config, service);
  const { nc, version } = await reachNats(config, service, logger, options.retryForMs ?? 0);
  let metrics: Metrics | undefined;
  try {
    metrics = await initMetrics({
      serviceName,
      env: config.env,
      ...(config.metricsPort === undefined ? {} : { prometheusPort: config.metricsPort }),
    });
    logger.info(
      { server: nc.getServer(), version, ...(owner === undefined ? {} : { owner }) },
      "connected to NATS",
    );
    const registry =
      owner === undefined
        ? // Right after `toolmesh setup`, or while a node restarts, the bucket's leader may be
          // being elected: wait for it, as for a consumer.
          await retryWhileUnavailable(
            () => ToolRegistry.open(nc, { subjects, log: logger, replicas: config.streamReplicas }),
            {
              what: "open the tool registry",
              onRetry: warnUnavailable(logger, subjects.registryBucket, "bucket"),
            },
          )
        : undefined;
    const watch = new ConnectionWatch(config.livenessDisconnectedMs);
    watch.follow(nc, (up, server) => {
      if (up) logger.info({ server }, "reconnected to NATS");
      else logger.warn({ server }, "disconnected from NATS; reconnecting");
    });
    const stats = answerStats({
      nc,
      subjects,
      metrics,
      service: serviceNameOf({ serviceName, env: config.env }),
      log: logger,
    });
    if (metrics.prometheusPort !== undefined)
      logger.info({ port: metrics.prometheusPort }, "metrics served at /metrics");
    const rt = new ProcessRuntime({
      config,
      nc,
      subjects,
      registry,
      log: logger,
      telemetry,
      metrics,
      readiness: options.readiness ?? new Readiness(),
      watch,
      stats,
    });
    rt.readiness.set("nats", () =>
      rt.connected() ? { ok: true } : { ok: false, detail: "not connected; reconnecting" },
    );
    return rt;
  } catch (err) {
    await nc.close();
    await metrics?.shutdown();
    throw err;
  }
}

/** What {@link ProcessRuntime} is made of: what {@link openRuntime} opened and started. */
interface RuntimeParts {
  config: RuntimeConfig;
  nc: NatsConnection;
  subjects: Subjects;
  registry: ToolRegistry | undefined;
  log: Logger;
  telemetry: Telemetry;
  metrics: Metrics;
  readiness: Readiness;
  /** Whether and since when the connection is down. */
  watch: ConnectionWatch;
  /** The subscription answering the stats subject. */
  stats: Subscription;
}

/** One process's runtime ({@link openRuntime}); the tasks to run when it closes are its state. */
class ProcessRuntime implements Runtime {
  readonly config: RuntimeConfig;
  readonly nc: NatsConnection;
  readonly subjects: Subjects;
  readonly registry: ToolRegistry | undefined;
  readonly log: Logger;
  readonly tracer: Tracer;
  readonly telemetry: Telemetry;
  readonly metrics: Metrics;
  readonly readiness: Readiness;
  readonly streamLimits: StreamLimits;
  readonly #watch: ConnectionWatch;
  readonly #stats: Subscription;
  readonly #closing: (() => Promise<void>)[] = [];

  constructor(parts: RuntimeParts) {
    this.config = parts.config;
    this.nc = parts.nc;
    this.subjects = parts.subjects;
    this.registry = parts.registry;
    this.log = parts.log;
    this.tracer = parts.telemetry.tracer;
    this.telemetry = parts.telemetry;
    this.metrics = parts.metrics;
    this.readiness = parts.readiness;
    this.streamLimits = meshSettings(parts.config);
    this.#watch = parts.watch;
    this.#stats = parts.stats;
  }

  connected(): boolean {
    return this.#watch.connected() && !this.nc.isClosed();
  }

  alive(): boolean {
    return !this.nc.isClosed() && this.#watch.alive();
  }

  onClose(task: () => Promise<void>): void {
    this.#closing.push(task);
  }

  async close(): Promise<void> {
    for (const task of this.#closing.splice(0)) await task().catch(() => undefined);
    this.#stats.unsubscribe();
    this.registry?.close();
    await this.nc.drain().catch(() => undefined);
    await Promise.all([this.telemetry.shutdown(), this.metrics.shutdown()]);
  }
}

/**
 * The tool owner whose account this process lives in: `TOOLMESH_OWNER`, for an executor or an
 * MCP bridge; undefined otherwise (the mesh account).
 */
export function ownerAccountOf(config: RuntimeConfig, service: string): string | undefined {
  return service === "executor" || service === "mcp-bridge" ? config.owner : undefined;
}

/**
 * Connects and checks the server. A server that does not answer (not started yet, restarting,
 * unreachable) is tried again with backoff — 250 ms doubling to 5 s — for `retryForMs`; a
 * server that answers and is refused (too old, no JetStream) is not.
 */
async function reachNats(
  config: RuntimeConfig,
  service: string,
  log: Logger,
  retryForMs: number,
): Promise<{ nc: NatsConnection; version: string }> {
  const servers = config.nats.servers;
  const subjects = createSubjects({ prefix: config.prefix });
  const owner = ownerAccountOf(config, service);
  const attempt = async (): Promise<{ nc: NatsConnection; version: string }> => {
    const nc = await connectNats({
      ...config.nats,
      name: `toolmesh-${service}`,
      // Replies to this process arrive below its role's own prefix (and in an owner's account,
      // below its owner's), which NATS permissions give to it alone (docs/security.md).
      inboxPrefix:
        owner === undefined
          ? subjects.inboxPrefix(service)
          : subjects.ownerInboxPrefix(service as "executor" | "mcp-bridge", owner),
    });
    try {
      // An owner's account has no JetStream: there is none of its own to check.
      return { nc, version: await assertServerSupported(nc, { jetstream: owner === undefined }) };
    } catch (err) {
      await nc.close();
      throw err;
    }
  };
  try {
    return await pRetry(attempt, {
      retries: Number.POSITIVE_INFINITY,
      minTimeout: 250,
      maxTimeout: 5_000,
      maxRetryTime: retryForMs,
      shouldRetry: ({ error }) => retryForMs > 0 && isTransient(error),
      onFailedAttempt: ({ error, attemptNumber }) => {
        if (retryForMs > 0 && isTransient(error))
          log.warn(
            { attempt: attemptNumber, servers, err: error },
            `cannot reach NATS (${error.message}); trying again`,
          );
      },
    });
  } catch (err) {
    if (retryForMs === 0 || !isTransient(err)) throw err;
    throw new StartupTimeoutError(
      `cannot reach NATS at ${servers} within ${retryForMs} ms (${err instanceof Error ? err.message : String(err)}): ` +
        "check NATS_URL and that nats-server runs, or raise TOOLMESH_STARTUP_TIMEOUT_MS",
      { cause: err },
    );
  }
}

/**
 * Whether another attempt may succeed: not a server that answered and refused (too old, no
 * JetStream, credentials), nor a credentials or key file that cannot be read.
 */
function isTransient(err: unknown): boolean {
  if (err instanceof ToolmeshError) return err.retryable;
  return !(err instanceof Error && typeof (err as NodeJS.ErrnoException).syscall === "string");
}

/**
 * Graceful shutdown on SIGTERM and SIGINT: `stop` stops taking work and finishes or hands
 * back what is in flight, then the process exits 0, or 1 when `stop` fails or reports that it
 * abandoned work (resolves false). A second signal exits at once with 1.
 */
export function installShutdown(log: Logger, stop: () => Promise<boolean | void>): void {
  let stopping = false;
  const onSignal = (signal: NodeJS.Signals): void => {
    if (stopping) {
      log.warn({ signal }, "second signal; exiting now");
      process.exit(1);
    }
    stopping = true;
    log.info({ signal }, "shutting down");
    stop().then(
      (clean) => process.exit(clean === false ? 1 : 0),
      (err: unknown) => {
        log.error({ err }, "shutdown failed");
        process.exit(1);
      },
    );
  };
  process.on("SIGTERM", onSignal);
  process.on("SIGINT", onSignal);
}

/** Something started on a runtime that can be stopped gracefully. */
export interface Stoppable {
  /** Stops taking work and finishes or hands back what is in flight, within `graceMs`. */
  stop(graceMs: number): Promise<void>;
  /** What runs right now (call keys), named in the log when shutdown abandons it. */
  inFlight?(): readonly string[];
}

/**
 * Stops `actor` within its grace time and, for handlers that ignore their abort signal, the
 * force time after it (Temporal's `shutdownForceTime`); then closes the runtime. Resolves
 * false when it gave up waiting: what still ran is logged and left to the server's
 * redelivery, and the connection is closed anyway.
 */
export async function stopActor(
  rt: Pick<Runtime, "log" | "close">,
  actor: Stoppable,
  timing: { shutdownGraceMs: number; shutdownForceMs: number },
): Promise<boolean> {
  if (
    await settledWithin(
      actor.stop(timing.shutdownGraceMs),
      timing.shutdownGraceMs + timing.shutdownForceMs,
    )
  ) {
    await rt.close();
    return true;
  }
  const abandoned = actor.inFlight?.() ?? [];
  rt.log.error(
    { abandoned: abandoned.length, calls: abandoned, forceMs: timing.shutdownForceMs },
    "handlers still running after the shutdown grace and force times; abandoning them",
  );
  // What hangs a handler (an unreachable server) may hang the drain too: bounded once more.
  await settledWithin(
    rt.close().catch(() => undefined),
    timing.shutdownForceMs,
  );
  return false;
}

/**
 * Serves actors for the life of the process: opens the runtime, starts them, serves the
 * health endpoints (when `healthPort` is set), and on SIGTERM reports not-ready first, then
 * stops them gracefully and closes. Resolves once they run.
 */
export async function serveActors(
  config: RuntimeConfig,
  service: string,
  start: (rt: Runtime) => Promise<Stoppable>,
): Promise<Runtime> {
  // Served from the start: while the process waits for NATS (within its start-up budget, after
  // which it exits) it is alive but not ready, so Kubernetes neither kills nor routes to it.
  let rt: Runtime | undefined;
  let started = false;
  let draining = false;
  const readiness = new Readiness();
  readiness.set("nats", () => ({ ok: false, detail: "connecting to NATS" }));
  readiness.set("consumers", () =>
    started ? { ok: true } : { ok: false, detail: "starting: consumers not bound yet" },
  );
  readiness.set("draining", () =>
    draining ? { ok: false, detail: "shutting down" } : { ok: true },
  );
  const health =
    config.healthPort === undefined
      ? undefined
      : await startHealthServer(config.healthPort, {
          live: () => rt === undefined || rt.alive(),
          readiness,
        });
  try {
    rt = await openRuntime(config, service, undefined, {
      retryForMs: config.startupTimeoutMs,
      readiness,
    });
  } catch (err) {
    health?.close();
    throw err;
  }
  const opened = rt;
  if (health !== undefined) {
    const { port } = health.address() as AddressInfo;
    opened.log.info({ port }, "health served at /healthz and /readyz");
  }
  const actor = await start(opened);
  started = true;
  installShutdown(opened.log, async () => {
    draining = true;
    try {
      return await stopActor(opened, actor, config);
    } finally {
      health?.close();
    }
  });
  return opened;
}

/**
 * The whole life of a service process, what a service's `main.ts` calls: parse the
 * environment and {@link serveActors}. A service that cannot start says why in one line on
 * stderr and exits 1.
 */
export async function runService(
  service: string,
  env: Readonly<Record<string, string | undefined>>,
  start: (rt: Runtime) => Promise<Stoppable>,
): Promise<void> {
  try {
    await serveActors(loadConfig(env), service, start);
  } catch (err) {
    process.stderr.write(
      `toolmesh ${service}: ${err instanceof Error ? err.message : String(err)}\n`,
    );
    process.exit(1);
  }
}

/** The runtime's registry, for the actors of the mesh account, which always open one. */
export function meshRegistry(rt: Runtime): ToolRegistry {
  if (rt.registry === undefined) {
    throw new Error(
      "this actor needs the mesh's registry, which a process in a tool owner's account (TOOLMESH_OWNER) does not open",
    );
  }
  return rt.registry;
}

/**
 * The audit trail of a mesh-account actor when `TOOLMESH_AUDIT` is on (ADR 0060), else
 * undefined; an actor in a tool owner's account writes none (the mesh records its calls).
 * `chains`: the actor appends to the tenants' chains itself and writes what the other
 * services hand on (the resolver); the others hand their events to it (ADR 0064).
 */
export async function meshAuditTrail(
  rt: Runtime,
  actor: string,
  { chains = false }: { chains?: boolean } = {},
): Promise<AuditTrail | undefined> {
  const { audit } = rt.config;
  if (audit === "off" || rt.config.owner !== undefined) return undefined;
  const metrics = toolmeshMetrics();
  const log = rt.log.child({ actor, part: "audit" });
  const trail = await AuditTrail.open(rt.nc, {
    subjects: rt.subjects,
    mode: audit,
    chains,
    writer: `${actor}@${hostname()}/${process.pid}`,
    observer: metrics,
    argumentsRecording: new Map(
      Object.entries(rt.config.auditArguments).map(([id, recording]) => [
        subjectToken(id),
        recording,
      ]),
    ),
    onHealth: (tenant, healthy, err) => {
      if (healthy) log.info({ tenant }, "audit trail written again");
      else
        log.warn({ tenant, err }, "cannot write the audit trail; its events are kept and retried");
    },
    onDropping: (tenant, queued) =>
      log.error(
        { tenant, queued },
        "audit trail still cannot be written and its queue is full: further events are dropped until it can (toolmesh setup --tenants makes a missing audit stream)",
      ),
  });
  const handedOn = chains ? serveAuditWrites(rt.nc, rt.subjects, trail, log) : undefined;
  // What it still holds is written once the actor stopped, within the shutdown force time;
  // what the other services hand on is taken and written until then.
  rt.onClose(async () => {
    await settleAudit(trail, rt.config.shutdownForceMs, log);
    await handedOn?.stop(rt.config.shutdownForceMs);
  });
  return trail;
}
