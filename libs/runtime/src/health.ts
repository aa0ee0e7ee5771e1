import { createServer } from "node:http";
import type { Server } from "node:http";

/** What the health endpoints report. */
export interface HealthState {
  /** The process works (its NATS connection is not closed). */
  live: () => boolean;
  /** The process takes work: started, connected, not shutting down. */
  ready: () => boolean;
  /** What the actors report about their parts; when given, `/readyz` answers it as JSON. */
  readiness?: () => Record<string, unknown> | undefined;
}

/**
 * Serves `GET /healthz` (liveness) and `GET /readyz` (readiness): 200 `ok` or 503
 * `unavailable` (`/readyz`: a JSON object with `status` and the actors' readiness details
 * when they report some), for Kubernetes probes. Listens on `port` (0: any free port).
 */
export async function startHealthServer(port: number, state: HealthState): Promise<Server> {
  const server = createServer((req, res) => {
    const check =
      req.url === "/healthz" ? state.live : req.url === "/readyz" ? state.ready : undefined;
    if (check === undefined) {
      res.writeHead(404).end("not found\n");
      return;
    }
    const ok = check();
    const detail = req.url === "/readyz" ? state.readiness?.() : undefined;
    if (detail !== undefined) {
      res
        .writeHead(ok ? 200 : 503, { "content-type": "application/json" })
        .end(`${JSON.stringify({ status: ok ? "ok" : "unavailable", ...detail })}\n`);
      return;
    }
    res
      .writeHead(ok ? 200 : 503, { "content-type": "text/plain" })
      .end(ok ? "ok\n" : "unavailable\n");
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, "0.0.0.0", () => resolve());
  });
  return server;
}
