import type { Runtime } from "@toolmesh/runtime";
import type { Resolver } from "./resolver.js";
import { startResolver } from "./resolver.js";

/** Starts a resolver configured by the runtime. */
export function startResolverFromRuntime(rt: Runtime): Promise<Resolver> {
  return startResolver({
    nc: rt.nc,
    subjects: rt.subjects,
    registry: rt.registry,
    tracer: rt.tracer,
    streamLimits: rt.streamLimits,
    log: rt.log.child({ actor: "resolver" }),
    defaultTimeoutMs: rt.config.defaultTimeoutMs,
    sessionMaxInFlight: rt.config.sessionMaxInFlight,
    callRetentionMs: rt.config.callRetentionMs,
  });
}
