import type { Runtime } from "@toolmesh/runtime";
import { toolmeshMetrics } from "@toolmesh/telemetry";
import type { Bridge } from "./bridge.js";

/**
 * Reports the bridge's servers: a readiness check `mcp:<server>` each (ok once initialised, or
 * idle when lazy; the last error otherwise) and the state and restart metrics.
 */
export function observeBridge(rt: Runtime, bridge: Bridge): void {
  for (const server of Object.keys(bridge.status())) {
    rt.readiness.set(`mcp:${server}`, () => {
      const now = bridge.status()[server];
      if (now === undefined) return { ok: false, detail: "not configured" };
      const ok = now.state === "ready" || now.state === "idle";
      return {
        ok,
        detail: {
          state: now.state,
          tools: now.tools.length,
          ...(now.lastError === undefined ? {} : { error: now.lastError }),
        },
      };
    });
  }
  toolmeshMetrics().observeMcpServers(() =>
    Object.entries(bridge.status()).map(([server, status]) => ({
      server,
      state: status.state,
      restarts: status.restarts,
    })),
  );
}
