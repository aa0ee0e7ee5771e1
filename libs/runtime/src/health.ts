import { createServer } from "node:http";
import type { Server } from "node:http";

/** The outcome of one named readiness check. */
export interface CheckResult {
  ok: boolean;
  /** Why it is not ok, or what it found, in a few words or a small object. */
  detail?: string | Record<string, unknown>;
}

/** What `/readyz` answers, as JSON. */
export interface ReadinessReport {
  status: "ready" | "unavailable";
  checks: Record<string, CheckResult>;
}

/**
 * The named checks that make a process ready: any actor adds its own (the runtime adds `nats`,
 * `consumers` and `draining`; the MCP bridge adds one per server, `mcp:<server>`). Ready when
 * every check is ok. A check must answer from memory; one that throws counts as not ok.
 */
export class Readiness {
  readonly #checks = new Map<string, () => CheckResult>();

  /** Adds or replaces the check `name`; returns the function that removes it. */
  set(name: string, check: () => CheckResult): () => void {
    this.#checks.set(name, check);
    return () => {
      if (this.#checks.get(name) === check) this.#checks.delete(name);
    };
  }

  /** Runs every check. */
  report(): ReadinessReport {
    const checks: Record<string, CheckResult> = {};
    let ready = true;
    for (const [name, check] of this.#checks) {
      let result: CheckResult;
      try {
        result = check();
      } catch (err) {
        result = { ok: false, detail: err instanceof Error ? err.message : String(err) };
      }
      checks[name] = result;
      ready &&= result.ok;
    }
    return { status: ready ? "ready" : "unavailable", checks };
  }
}

/** What the health endpoints report. */
export interface HealthState {
  /** The process works (its NATS connection is not closed). */
  live: () => boolean;
  /** The checks behind `/readyz`. */
  readiness: Readiness;
}

/**
 * Serves `GET /healthz` (liveness: 200 `ok` or 503 `unavailable`) and `GET /readyz` (readiness:
 * 200 or 503 with a JSON {@link ReadinessReport} naming every check), for Kubernetes probes.
 * Listens on `port` (0: any free port).
 */
export async function startHealthServer(port: number, state: HealthState): Promise<Server> {
  const server = createServer((req, res) => {
    const path = req.url?.split("?")[0];
    if (path === "/healthz") {
      const ok = state.live();
      res
        .writeHead(ok ? 200 : 503, { "content-type": "text/plain" })
        .end(ok ? "ok\n" : "unavailable\n");
      return;
    }
    if (path === "/readyz") {
      const report = state.readiness.report();
      res
        .writeHead(report.status === "ready" ? 200 : 503, { "content-type": "application/json" })
        .end(`${JSON.stringify(report)}\n`);
      return;
    }
    res.writeHead(404).end("not found\n");
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, "0.0.0.0", () => resolve());
  });
  return server;
}
