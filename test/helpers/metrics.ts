import type { ServiceProcess } from "./mesh.js";

/** The text a service serves at /metrics (started with `TOOLMESH_METRICS_PORT=0`). */
export async function scrapeMetrics(service: ServiceProcess): Promise<string> {
  const { port } = await service.waitForLog((l) => l.msg === "metrics served at /metrics");
  return (await fetch(`http://127.0.0.1:${String(port)}/metrics`)).text();
}

/**
 * The sum of a metric's samples in Prometheus text whose labels match `labels` (a label given
 * as "" must be absent; `error_type: ""` selects samples without an error).
 */
export function sample(text: string, name: string, labels: Record<string, string> = {}): number {
  let total = 0;
  for (const line of text.split("\n")) {
    const match = /^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (match === null || match[1] !== name) continue;
    const found = Object.fromEntries(
      [...(match[2] ?? "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)].map((m) => [m[1], m[2]]),
    );
    const noError = labels.error_type === "";
    if (
      Object.entries(labels).every(([k, v]) =>
        v === "" ? found[k] === undefined : found[k] === v,
      ) &&
      (!noError || found.error_type === undefined)
    )
      total += Number(match[3]);
  }
  return total;
}
