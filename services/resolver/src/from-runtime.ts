import { AccessView, StateStore, loadCatalogConfig, logConfigWarnings } from "@toolmesh/catalog";
import type { Runtime } from "@toolmesh/runtime";
import { meshRegistry } from "@toolmesh/runtime";
import type { Resolver } from "./resolver.js";
import { startResolver } from "./resolver.js";

/**
 * Starts a resolver configured by the runtime, checking calls against the agents of
 * `TOOLMESH_CONFIG_DIR` and the tool-group switches in KV.
 */
export async function startResolverFromRuntime(rt: Runtime): Promise<Resolver> {
  const log = rt.log.child({ actor: "resolver" });
  const catalog = await loadCatalogConfig(rt.config.configDir);
  logConfigWarnings(catalog, log);
  const store = await StateStore.open(rt.nc, {
    subjects: rt.subjects,
    sessionTtlMs: rt.config.sessionStateTtlMs,
    replicas: rt.config.streamReplicas,
    compression: rt.config.streamCompression,
  });
  const access = await AccessView.open(rt.nc, store, { agents: catalog.agents, log });
  const resolver = await startResolver({
    nc: rt.nc,
    subjects: rt.subjects,
    registry: meshRegistry(rt),
    tracer: rt.tracer,
    streamLimits: rt.streamLimits,
    log,
    defaultTimeoutMs: rt.config.defaultTimeoutMs,
    sessionMaxInFlight: rt.config.sessionMaxInFlight,
    ackWaitMs: rt.config.ackWaitMs,
    callRetentionMs: rt.config.callRetentionMs,
    access,
    replicas: rt.config.streamReplicas,
    quotaReconcileMs: rt.config.quotaReconcileMs,
    tenantMaxStoredBytes: rt.config.tenantMaxStoredBytes,
    fairShareWindow: rt.config.fairShareWindow,
    fairShareIdleMs: rt.config.fairShareIdleMs,
  });
  return {
    async stop(graceMs) {
      await resolver.stop(graceMs);
      access.close();
    },
  };
}
