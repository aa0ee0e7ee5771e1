import type { AddressInfo } from "node:net";
import type { NatsConnection } from "@nats-io/nats-core";
import type { Subjects } from "@toolmesh/protocol";
import { createSubjects } from "@toolmesh/protocol";
import type { StreamLimits } from "@toolmesh/nats";
import { assertServerSupported, connectNats } from "@toolmesh/nats";
import { ToolRegistry } from "@toolmesh/registry";
import type { Logger, Metrics, Telemetry, Tracer } from "@toolmesh/telemetry";
import {
  createLogger,
  initMetrics,
  initTelemetry,
  serviceNameOf,
  setPayloadRecording,
} from "@toolmesh/telemetry";
import type { RuntimeConfig } from "./config.js";
import { loadConfig } from "./config.js";
import { Readiness, startHealthServer } from "./health.js";
import { answerStats } from "./stats.js";

/** What every actor needs: one connection, one logger, one tracer, the live registry. */
export interface Runtime {
  readonly config: RuntimeConfig;
  readonly nc: NatsConnection;
  readonly subjects: Subjects;
  readonly registry: ToolRegistry;
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
  /** Drains the connection and flushes telemetry. */
  close(): Promise<void>;
}

/** Connects, checks the server, opens the registry and starts telemetry for one process. */
export async function openRuntime(
  config: RuntimeConfig,
  service: string,
  log?: Logger,
): Promise<Runtime> {
  const logger = log ?? createLogger({ service, level: config.logLevel });
  const serviceName = `toolmesh-${service}`;
  const telemetry = initTelemetry({ serviceName, env: config.env });
  setPayloadRecording(config.tracePayloads);
  const nc = await connectNats({ ...config.nats, name: serviceName });
  let metrics: Metrics | undefined;
  try {
    metrics = await initMetrics({
      serviceName,
      env: config.env,
      ...(config.metricsPort === undefined ? {} : { prometheusPort: config.metricsPort }),
    });
    const version = await assertServerSupported(nc);
    logger.info({ server: nc.getServer(), version }, "connected to NATS");
    const subjects = createSubjects({ prefix: config.prefix });
    const registry = await ToolRegistry.open(nc, { subjects, log: logger });
    let connected = true;
    void (async () => {
      for await (const status of nc.status()) {
        if (status.type === "disconnect") {
          connected = false;
          logger.warn({ server: status.server }, "disconnected from NATS; reconnecting");
        } else if (status.type === "reconnect") {
          connected = true;
          logger.info({ server: status.server }, "reconnected to NATS");
        }
      }
    })();
    const stats = answerStats({
      nc,
      subjects,
      metrics,
      service: serviceNameOf({ serviceName, env: config.env }),
      log: logger,
    });
    if (metrics.prometheusPort !== undefined)
      logger.info({ port: metrics.prometheusPort }, "metrics served at /metrics");
    const readiness = new Readiness();
    const isConnected = (): boolean => connected && !nc.isClosed();
    readiness.set("nats", () =>
      isConnected() ? { ok: true } : { ok: false, detail: "not connected; reconnecting" },
    );
    const processMetrics = metrics;
    return {
      config,
      nc,
      subjects,
      registry,
      log: logger,
      tracer: telemetry.tracer,
      telemetry,
      metrics: processMetrics,
      readiness,
      connected: isConnected,
      streamLimits: {
        maxMessageBytes: config.maxMessageBytes,
        duplicateWindowMs: config.duplicateWindowMs,
        maxQueuedCalls: config.maxQueuedCalls,
      },
      async close() {
        stats.unsubscribe();
        registry.close();
        await nc.drain().catch(() => undefined);
        await Promise.all([telemetry.shutdown(), processMetrics.shutdown()]);
      },
    };
  } catch (err) {
    await nc.close();
    await metrics?.shutdown();
    throw err;
  }
}

/**
 * Graceful shutdown on SIGTERM and SIGINT: `stop` stops taking work and finishes or hands
 * back what is in flight, then the process exits 0. A second signal exits at once with 1.
 */
export function installShutdown(log: Logger, stop: () => Promise<void>): void {
  let stopping = false;
  const onSignal = (signal: NodeJS.Signals): void => {
    if (stopping) {
      log.warn({ signal }, "second signal; exiting now");
      process.exit(1);
    }
    stopping = true;
    log.info({ signal }, "shutting down");
    stop().then(
      () => process.exit(0),
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
  const rt = await openRuntime(config, service);
  let started = false;
  let draining = false;
  rt.readiness.set("consumers", () =>
    started ? { ok: true } : { ok: false, detail: "starting: consumers not bound yet" },
  );
  rt.readiness.set("draining", () =>
    draining ? { ok: false, detail: "shutting down" } : { ok: true },
  );
  const health =
    config.healthPort === undefined
      ? undefined
      : await startHealthServer(config.healthPort, {
          live: () => !rt.nc.isClosed(),
          readiness: rt.readiness,
        });
  if (health !== undefined) {
    const { port } = health.address() as AddressInfo;
    rt.log.info({ port }, "health served at /healthz and /readyz");
  }
  const actor = await start(rt);
  started = true;
  installShutdown(rt.log, async () => {
    draining = true;
    await actor.stop(config.shutdownGraceMs);
    await rt.close();
    health?.close();
  });
  return rt;
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
