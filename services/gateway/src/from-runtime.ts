import type { Logger } from "@toolmesh/telemetry";
import { toolmeshMetrics } from "@toolmesh/telemetry";
import { CallStore } from "@toolmesh/call-store";
import { StateStore } from "@toolmesh/catalog";
import { subjectToken } from "@toolmesh/protocol";
import type { Runtime, Stoppable } from "@toolmesh/runtime";
import { meshRegistry, packageVersion } from "@toolmesh/runtime";
import type { ToolRegistry } from "@toolmesh/registry";
import { Authenticator } from "./auth.js";
import { CallDelegation } from "./delegation.js";
import type { GatewayConfig } from "./config.js";
import type { GatewayServer, GatewayServerOptions } from "./gateway.js";
import { createGatewayServer } from "./gateway.js";
import { MeshCredentialLimits } from "./mesh-limits.js";
import { MeshView } from "./mesh-view.js";

/** A running gateway. */
export interface Gateway extends Stoppable {
  /** The port `/mcp` is served on. */
  readonly port: number;
  readonly server: GatewayServer;
}

/** The gateway package's version (its package.json, beside `src/` and `dist/`). */
export function gatewayVersion(): string {
  return packageVersion(new URL("../package.json", import.meta.url));
}

/**
 * Starts the MCP gateway on the runtime's connection: `/mcp` on `config.port`, acting for the
 * tenants its credentials name. Tool-list changes come from the registry's watcher and the
 * tenants' group switches.
 */
export async function startGatewayFromRuntime(
  rt: Runtime,
  config: GatewayConfig,
): Promise<Gateway> {
  const log = rt.log.child({ actor: "gateway" });
  const registry = meshRegistry(rt);
  const auth = await Authenticator.create(config, log);
  const store = await StateStore.open(rt.nc, {
    subjects: rt.subjects,
    sessionTtlMs: rt.config.sessionStateTtlMs,
    replicas: rt.config.streamReplicas,
    compression: rt.config.streamCompression,
  });
  const calls = await CallStore.bind(rt.nc, rt.subjects);
  const mesh = meshViewOf(rt, registry, calls, log);

  const listeners = new ToolListListeners();
  const stopRegistry = registry.onChange(() => listeners.notify());
  const groupWatch = await store.groups.watch({ include: "updates" });
  void (async () => {
    for await (const entry of groupWatch) listeners.notify(entry.key);
  })().catch(() => undefined);

  const instruments = toolmeshMetrics();

  const gateway = new RunningGateway(
    rt,
    {
      config,
      auth,
      mesh,
      log,
      tracer: rt.tracer,
      version: gatewayVersion(),
      alive: () => rt.alive(),
      observe: (tenant, tool, outcome, durationMs) =>
        instruments.gatewayCallEnded(tenant, tool, outcome, durationMs / 1_000),
      onToolsChanged: (tenant, listener) => listeners.add(tenant, listener),
      ...(config.limits === "mesh"
        ? {
            meshLimits: await MeshCredentialLimits.open(rt.nc, rt.subjects, {
              maxConcurrent: config.maxConcurrent,
              ratePerS: config.ratePerS,
              burst: config.rateBurst,
              // A request counts no longer than the longest call it may wait for, and a grace.
              holdMs: rt.config.defaultTimeoutMs + 30_000,
              log,
            }),
          }
        : {}),
    },
    () => {
      stopRegistry();
      groupWatch.stop();
    },
  );
  await gateway.listen();
  log.info(
    {
      port: gateway.port,
      host: config.host,
      keys: config.keysFile !== undefined,
      jwt: config.jwt !== undefined,
      anonymousTenant: config.anonymousTenant,
    },
    "gateway started",
  );
  return gateway;
}

/** The gateway's view of the mesh: tools, calls and, with a token endpoint, call delegation. */
function meshViewOf(rt: Runtime, registry: ToolRegistry, calls: CallStore, log: Logger): MeshView {
  return new MeshView({
    nc: rt.nc,
    subjects: rt.subjects,
    prefix: rt.config.prefix,
    registry,
    calls,
    defaultTimeoutMs: rt.config.defaultTimeoutMs,
    retentionMs: rt.config.callRetentionMs,
    ...(rt.config.tokenEndpoint === undefined
      ? {}
      : {
          delegation: new CallDelegation(
            rt.nc,
            rt.subjects,
            rt.config.tokenEndpoint,
            log,
            rt.config.defaultTimeoutMs,
          ),
        }),
  });
}

/**
 * A running gateway ({@link startGatewayFromRuntime}): its server, and whether it drains, which
 * its readiness checks report.
 */
class RunningGateway implements Gateway {
  readonly server: GatewayServer;
  readonly #rt: Runtime;
  readonly #auth: Authenticator;
  readonly #stopFollowing: () => void;
  #port = 0;
  #draining = false;

  /** `stopFollowing` stops following the changes of the tool lists. */
  constructor(
    rt: Runtime,
    options: Omit<GatewayServerOptions, "ready">,
    stopFollowing: () => void,
  ) {
    this.#rt = rt;
    this.#auth = options.auth;
    this.#stopFollowing = stopFollowing;
    this.server = createGatewayServer({ ...options, ready: () => this.#ready() });
  }

  get port(): number {
    return this.#port;
  }

  /** Serves `/mcp` and adds the gateway's own readiness check (not draining). */
  async listen(): Promise<void> {
    this.#port = await this.server.listen();
    this.#rt.readiness.set("gateway", () =>
      this.#draining ? { ok: false, detail: "shutting down" } : { ok: true },
    );
  }

  async stop(graceMs: number): Promise<void> {
    this.#draining = true;
    const until = Date.now() + graceMs;
    while (this.server.inFlight() > 0 && Date.now() < until)
      await new Promise((resolve) => setTimeout(resolve, 50));
    this.#stopFollowing();
    this.#auth.close();
    await this.server.close();
  }

  /** Whether this replica can serve: not draining, and its NATS connection up. */
  #ready(): { ok: boolean; detail?: string } {
    if (this.#draining) return { ok: false, detail: "shutting down" };
    if (!this.#rt.connected()) return { ok: false, detail: "NATS connection down" };
    return { ok: true };
  }
}

/** Tool-list listeners by tenant: a registry change concerns everyone, a group switch its tenant. */
class ToolListListeners {
  readonly #byTenant = new Map<string, Set<() => void>>();

  /** Tells the listeners of `tenant` (a groups key: its token), or everyone's. */
  notify(tenant?: string): void {
    for (const [t, set] of this.#byTenant) {
      if (tenant !== undefined && subjectToken(subjectToken(t)) !== tenant) continue;
      for (const listener of set) listener();
    }
  }

  /** Adds a listener of `tenant`; returns the function that removes it. */
  add(tenant: string, listener: () => void): () => void {
    let set = this.#byTenant.get(tenant);
    if (set === undefined) {
      set = new Set();
      this.#byTenant.set(tenant, set);
    }
    set.add(listener);
    const added = set;
    return () => {
      added.delete(listener);
      if (added.size === 0) this.#byTenant.delete(tenant);
    };
  }
}
