import { StateStore, loadCatalogConfig, logConfigWarnings } from "@toolmesh/catalog";
import type { Runtime } from "@toolmesh/runtime";
import { meshRegistry } from "@toolmesh/runtime";
import { PolicyView } from "@toolmesh/policy";
import type { SchemaExpander } from "./schema-expander.js";
import { startSchemaExpander } from "./schema-expander.js";

/**
 * Starts a schema expander configured by the runtime: tool sets and agents from
 * `TOOLMESH_CONFIG_DIR`, catalogs filtered by the policy sets in force, session state kept `TOOLMESH_SESSION_STATE_TTL_MS` after its last change.
 */
export async function startSchemaExpanderFromRuntime(rt: Runtime): Promise<SchemaExpander> {
  const log = rt.log.child({ actor: "schema-expander" });
  const catalog = await loadCatalogConfig(rt.config.configDir);
  logConfigWarnings(catalog, log);
  const store = await StateStore.open(rt.nc, {
    subjects: rt.subjects,
    sessionTtlMs: rt.config.sessionStateTtlMs,
    replicas: rt.config.streamReplicas,
    compression: rt.config.streamCompression,
  });
  const policies = await PolicyView.open(rt.nc, {
    subjects: rt.subjects,
    replicas: rt.config.streamReplicas,
    log,
  });
  const expander = await startSchemaExpander({
    nc: rt.nc,
    subjects: rt.subjects,
    registry: meshRegistry(rt),
    store,
    catalog,
    log,
    tracer: rt.tracer,
    streamLimits: rt.streamLimits,
    ackWaitMs: rt.config.ackWaitMs,
    policies: policies.decider,
  });
  return {
    async stop(graceMs) {
      await expander.stop(graceMs);
      policies.close();
    },
  };
}
