import type { NatsConnection } from "@nats-io/nats-core";
import type { Subjects } from "@toolmesh/protocol";
import { createSubjects } from "@toolmesh/protocol";
import type { MeshSettings, StreamLimits } from "@toolmesh/nats";
import { assertServerSupported, connectNats } from "@toolmesh/nats";
import { ToolRegistry } from "@toolmesh/registry";
import type { Logger, Telemetry, Tracer } from "@toolmesh/telemetry";
import { createLogger, initTelemetry } from "@toolmesh/telemetry";
import type { RuntimeConfig } from "./config.js";
import { loadConfig } from "./config.js";
import { startHealthServer } from "./health.js";

/** What every actor needs: one connection, one logger, one tracer, the live registry. */
export interface Runtime {
  readonly config: RuntimeConfig;
  readonly nc: NatsConnection;
  readonly subjects: Subjects;
  readonly registry: ToolRegistry;
  readonly log: Logger;
  readonly tracer: Tracer;
  readonly telemetry: Telemetry;
  readonly streamLimits: StreamLimits;
  /** Whether the NATS connection is up right now (false while reconnecting). */
  connected(): boolean;
  /** Drains the connection and flushes telemetry. */
  close(): Promise<void>;
}

/** What shapes the streams, buckets and shared consumers, as configured. */
export function meshSettings(config: RuntimeConfig): MeshSettings {
  return {
    maxMessageBytes: config.maxMessageBytes,
    duplicateWindowMs: config.duplicateWindowMs,
    maxQueuedCalls: config.maxQueuedCalls,
    replicas: config.streamReplicas,
    callRetentionMs: config.callRetentionMs,
    sessionStateTtlMs: config.sessionStateTtlMs,
    ackWaitMs: config.ackWaitMs,
  };
}

/** Connects, checks the server, opens the registry and starts telemetry for one process. */
export async function openRuntime(
  config: RuntimeConfig,
  service: string,
  log?: Logger,
): Promise<Runtime> {
  const logger = log ?? createLogger({ service, level: config.logLevel });
  const telemetry = initTelemetry({ serviceName: `toolmesh-${service}`, env: config.env });
  const subjects = createSubjects({ prefix: config.prefix });
  const nc = await connectNats({
    ...config.nats,
    name: `toolmesh-${service}`,
    // Replies to this process arrive below its role's own prefix, which NATS permissions
    // give to this role alone (docs/security.md).
    inboxPrefix: subjects.inboxPrefix(service),
  });
  try {
    const version = await assertServerSupported(nc);
    logger.info({ server: nc.getServer(), version }, "connected to NATS");
    const registry = await ToolRegistry.open(nc, {
      subjects,
      log: logger,
      replicas: config.streamReplicas,
    });
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
    return {
      config,
      nc,
      subjects,
      registry,
      log: logger,
      tracer: telemetry.tracer,
      telemetry,
      connected: () => connected && !nc.isClosed(),
      streamLimits: meshSettings(config),
      async close() {
        registry.close();
        await nc.drain().catch(() => undefined);
        await telemetry.shutdown();
      },
    };
  } catch (err) {
    await nc.close();
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
  let ready = false;
  const health =
    config.healthPort === undefined
      ? undefined
      : await startHealthServer(config.healthPort, {
          live: () => !rt.nc.isClosed(),
          ready: () => ready && rt.connected(),
        });
  const actor = await start(rt);
  ready = true;
  installShutdown(rt.log, async () => {
    ready = false;
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
