import type { GatewayConfig } from "@toolmesh/gateway";
import type { Runtime, Stoppable } from "@toolmesh/runtime";

/** Settings of actors beyond the runtime's, read only when that actor starts. */
export interface ActorSettings {
  /** The MCP gateway's configuration. */
  gateway?: () => GatewayConfig;
}

/**
 * The actors a process can run, and how each starts. Each actor's package is loaded when it
 * starts, so a command that runs none (every command but `serve` and `dev`) starts quickly.
 */
const STARTERS = {
  resolver: async (rt: Runtime) =>
    (await import("@toolmesh/resolver")).startResolverFromRuntime(rt),
  executor: async (rt: Runtime) =>
    (await import("@toolmesh/executor")).startExecutorFromRuntime(rt),
  "mcp-bridge": async (rt: Runtime) =>
    (await import("@toolmesh/mcp-bridge")).startBridgeFromRuntime(rt),
  "schema-expander": async (rt: Runtime) =>
    (await import("@toolmesh/schema-expander")).startSchemaExpanderFromRuntime(rt),
  gateway: async (rt: Runtime, settings: ActorSettings) => {
    if (settings.gateway === undefined) throw new Error("the gateway has no configuration");
    return (await import("@toolmesh/gateway")).startGatewayFromRuntime(rt, settings.gateway());
  },
} as const satisfies Record<string, (rt: Runtime, settings: ActorSettings) => Promise<Stoppable>>;

/** Names of the actors. */
export const ROLES = Object.keys(STARTERS) as Role[];

/** One actor. */
export type Role = keyof typeof STARTERS;

/** Starts the given actors on one runtime (one connection, one logger). */
export async function startActors(
  rt: Runtime,
  roles: readonly Role[],
  settings: ActorSettings = {},
): Promise<Stoppable> {
  const started: Stoppable[] = [];
  for (const role of new Set(roles)) started.push(await STARTERS[role](rt, settings));
  return {
    async stop(graceMs) {
      await Promise.all(started.map((actor) => actor.stop(graceMs)));
    },
    inFlight: () => started.flatMap((actor) => actor.inFlight?.() ?? []),
  };
}
