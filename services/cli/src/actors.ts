import { startExecutorFromRuntime } from "@toolmesh/executor";
import { startBridgeFromRuntime } from "@toolmesh/mcp-bridge";
import { startResolverFromRuntime } from "@toolmesh/resolver";
import { startSchemaExpanderFromRuntime } from "@toolmesh/schema-expander";
import type { Runtime, Stoppable } from "@toolmesh/runtime";

/** The actors a process can run, and how each starts. */
const STARTERS = {
  resolver: startResolverFromRuntime,
  executor: startExecutorFromRuntime,
  "mcp-bridge": startBridgeFromRuntime,
  "schema-expander": startSchemaExpanderFromRuntime,
} as const satisfies Record<string, (rt: Runtime) => Promise<Stoppable>>;

/** Names of the actors. */
export const ROLES = Object.keys(STARTERS) as Role[];

/** One actor. */
export type Role = keyof typeof STARTERS;

/** Starts the given actors on one runtime (one connection, one logger). */
export async function startActors(rt: Runtime, roles: readonly Role[]): Promise<Stoppable> {
  const started: Stoppable[] = [];
  for (const role of new Set(roles)) started.push(await STARTERS[role](rt));
  return {
    async stop(graceMs) {
      await Promise.all(started.map((actor) => actor.stop(graceMs)));
    },
    inFlight: () => started.flatMap((actor) => actor.inFlight?.() ?? []),
  };
}
