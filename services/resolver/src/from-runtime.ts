import { AccessView, StateStore, loadCatalogConfig, logConfigWarnings } from "@toolmesh/catalog";
import type { Runtime } from "@toolmesh/runtime";
import { meshAuditTrail, meshRegistry } from "@toolmesh/runtime";
import { PolicyView } from "@toolmesh/policy";
import type { Resolver } from "./resolver.js";
import type { ToolAccessPolicy } from "./handle-call.js";
import { startResolver } from "./resolver.js";

/**
 * Starts a resolver configured by the runtime, checking calls against the agents of
 * `TOOLMESH_CONFIG_DIR`, the tool-group switches in KV and the policy sets in force.
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
  const groups = await AccessView.open(rt.nc, store, { agents: catalog.agents, log });
  const policies = await PolicyView.open(rt.nc, {
    subjects: rt.subjects,
    replicas: rt.config.streamReplicas,
    log,
  });
  // A tool the policies hide is refused before its arguments are read, as one whose group is
  // off: its schema never goes out in a missing_arguments answer.
  const access: ToolAccessPolicy = {
    check: (definition, at, agent, subject) =>
      groups.check(definition, at, agent) ??
      policies.decider.listRefusal({
        tenant: at.tenant,
        tool: definition,
        agent,
        subject,
        session: at.session,
      }),
  };
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
    maxResultBytes: rt.config.maxResultBytes,
    access,
    policies: policies.decider,
    replicas: rt.config.streamReplicas,
    quotaReconcileMs: rt.config.quotaReconcileMs,
    tenantMaxStoredBytes: rt.config.tenantMaxStoredBytes,
    fairShareWindow: rt.config.fairShareWindow,
    fairShareIdleMs: rt.config.fairShareIdleMs,
    tenantMaxBytesInFlight: rt.config.tenantMaxBytesInFlight,
    audit: await meshAuditTrail(rt, "resolver", { chains: true }),
  });
  return {
    async stop(graceMs) {
      await resolver.stop(graceMs);
      groups.close();
      policies.close();
    },
  };
}
