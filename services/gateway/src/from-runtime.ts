import { toolmeshMetrics } from "@toolmesh/telemetry";
import { CallStore } from "@toolmesh/call-store";
import { StateStore } from "@toolmesh/catalog";
import { subjectToken } from "@toolmesh/protocol";
import type { Runtime, Stoppable } from "@toolmesh/runtime";
import { meshRegistry, packageVersion } from "@toolmesh/runtime";
import { Authenticator } from "./auth.js";
import { CallDelegation } from "./delegation.js";
import type { GatewayConfig } from "./config.js";
import type { GatewayServer } from "./gateway.js";
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
  const mesh = new MeshView({
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

  const listeners = new ToolListListeners();
  const stopRegistry = registry.onChange(() => listeners.notify());
  const groupWatch = await store.groups.watch({ include: "updates" });
  void (async () => {
    for await (const entry of groupWatch) listeners.notify(entry.key);
  })().catch(() => undefined);

  const instruments = toolmeshMetrics();

  let draining = false;
  const server = createGatewayServer({
    config,
    auth,
    mesh,
    log,
    tracer: rt.tracer,
    version: gatewayVersion(),
    alive: () => rt.alive(),
    ready: () => {
      if (draining) return { ok: false, detail: "shutting down" };
      if (!rt.connected()) return { ok: false, detail: "NATS connection down" };
      return { ok: true };
    },
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
          }),
        }
      : {}),
  });
  const port = await server.listen();
  rt.readiness.set("gateway", () =>
    draining ? { ok: false, detail: "shutting down" } : { ok: true },
  );
  log.info(
    {
      port,
      host: config.host,
      keys: config.keysFile !== undefined,
      jwt: config.jwt !== undefined,
      anonymousTenant: config.anonymousTenant,
    },
    "gateway started",
  );
  return {
    port,
    server,
    async stop(graceMs) {
      draining = true;
      const until = Date.now() + graceMs;
      while (server.inFlight() > 0 && Date.now() < until)
        await new Promise((resolve) => setTimeout(resolve, 50));
      stopRegistry();
      groupWatch.stop();
      auth.close();
      await server.close();
    },
  };
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
