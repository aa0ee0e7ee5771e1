import type { NatsConnection } from "@nats-io/nats-core";
import type { Command } from "commander";
import { Defaults, createSubjects } from "@toolmesh/protocol";
import { ToolRegistry } from "@toolmesh/registry";
import type { RuntimeConfig } from "@toolmesh/runtime";
import { say } from "./print.js";
import type { MeshStats, TenantStats, ToolStats } from "./stats.js";
import { gatherStats } from "./stats.js";
import { renderStorage } from "./storage-stats.js";
import { commandLog, connectCli } from "./commands.js";

/** Connects and gathers the mesh's stats once per call of `gather` until `fn` resolves. */
export async function withStats<T>(
  config: RuntimeConfig,
  fn: (gather: () => Promise<MeshStats>) => Promise<T>,
  options: { tenant?: string } = {},
): Promise<T> {
  const nc: NatsConnection = await connectCli(config, "operator");
  try {
    const subjects = createSubjects({ prefix: config.prefix });
    const registry = await ToolRegistry.open(nc, {
      subjects,
      log: commandLog(),
      watch: false,
    });
    return await fn(async () => {
      const tools = (await registry.fetchAll()).map((t) => t.name);
      return gatherStats(nc, subjects, tools, {
        ...options,
        stored: {
          defaultBound: config.tenantMaxStoredBytes,
          windowMs: Math.max(config.callRetentionMs, Defaults.sessionRetentionMs),
        },
      });
    });
  } finally {
    await nc.close();
  }
}

/** `toolmesh stats`: per tool and per service, from every process and JetStream. */
export async function statsCommand(
  config: RuntimeConfig,
  options: { json?: boolean; tenant?: string },
): Promise<number> {
  return withStats(
    config,
    async (gather) => {
      const stats = await gather();
      if (options.json === true) say(JSON.stringify(stats));
      else
        for (const line of renderStats(stats, { width: process.stdout.columns ?? 120 })) say(line);
      return 0;
    },
    options.tenant === undefined ? {} : { tenant: options.tenant },
  );
}

/** Columns of the tools table, also the sort keys of `top`. */
export const SORT_KEYS = [
  "tool",
  "calls",
  "errors",
  "p50",
  "p99",
  "inflight",
  "queue",
  "executors",
] as const;

/** One column of the tools table. */
export type SortKey = (typeof SORT_KEYS)[number];

function totalCalls(t: ToolStats): number {
  return (
    Object.values(t.calls).reduce((a, b) => a + b, 0) +
    Object.values(t.rejected).reduce((a, b) => a + b, 0)
  );
}

const sortValue: Record<SortKey, (t: ToolStats) => number | string> = {
  tool: (t) => t.tool,
  calls: totalCalls,
  errors: (t) => t.error_rate,
  p50: (t) => t.p50_ms ?? -1,
  p99: (t) => t.p99_ms ?? -1,
  inflight: (t) => t.in_flight,
  queue: (t) => (t.queue?.pending ?? 0) + (t.queue?.ack_pending ?? 0),
  executors: (t) => t.executors,
};

/** Tools whose name contains `filter`, sorted by `sort` (numbers high first, names A→Z). */
export function selectTools(
  tools: readonly ToolStats[],
  options: { sort?: SortKey; filter?: string; reverse?: boolean },
): ToolStats[] {
  const key = options.sort ?? "calls";
  const filter = options.filter?.toLowerCase();
  const chosen = tools.filter((t) => filter === undefined || t.tool.toLowerCase().includes(filter));
  chosen.sort((a, b) => {
    const x = sortValue[key](a);
    const y = sortValue[key](b);
    const order =
      typeof x === "string" || typeof y === "string"
        ? String(x).localeCompare(String(y))
        : y - x || a.tool.localeCompare(b.tool);
    return options.reverse === true ? -order : order;
  });
  return chosen;
}

const ms = (v: number | undefined): string => (v === undefined ? "-" : v.toFixed(v < 10 ? 1 : 0));

/**
 * The stats as text lines: a tools table, then services, resolvers, tenants, what each stream
 * holds against its bound, and MCP servers.
 */
export function renderStats(
  stats: MeshStats,
  options: { sort?: SortKey; filter?: string; reverse?: boolean; width?: number } = {},
): string[] {
  const rows = selectTools(stats.tools, options).map((t) => [
    t.tool,
    String(totalCalls(t)),
    `${(t.error_rate * 100).toFixed(1)}%`,
    ms(t.p50_ms),
    ms(t.p99_ms),
    String(t.in_flight),
    t.queue === undefined ? "-" : String(t.queue.pending + t.queue.ack_pending),
    String(t.executors),
  ]);
  const header = ["TOOL", "CALLS", "ERR", "P50ms", "P99ms", "INFLIGHT", "QUEUE", "EXECUTORS"];
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? "").length)));
  const line = (cells: string[]): string =>
    cells
      .map((c, i) => (i === 0 ? c.padEnd(widths[i] ?? 0) : c.padStart(widths[i] ?? 0)))
      .join("  ")
      .slice(0, options.width ?? Infinity);
  const rejected = Object.entries(stats.resolver.rejected)
    .map(([code, n]) => `${code} ${n}`)
    .join(", ");
  const lines = [line(header), ...rows.map(line)];
  if (rows.length === 0) lines.push(options.filter === undefined ? "no tools" : "no tool matches");
  lines.push(
    "",
    `services: ${stats.services.length === 0 ? "none answered" : summarizeServices(stats)}`,
    `resolved ${stats.resolver.resolved}, rejected ${rejected === "" ? "0" : rejected}; dead letters ${stats.dead_letters}; schemas sent ${stats.schema.expansions} (to ${stats.schema.sessions} sessions)`,
  );
  if (stats.tenants.length > 0) lines.push("", ...renderTenants(stats.tenants));
  if (stats.storage.length > 0) lines.push("", ...renderStorage(stats.storage));
  for (const s of stats.mcp_servers) {
    const states = Object.entries(s.states)
      .map(([state, n]) => `${state} ${n}`)
      .join(", ");
    lines.push(
      `mcp ${s.server}: ${states === "" ? "no replica" : states}; restarts ${s.restarts}; requests ${s.requests} (p50 ${ms(s.p50_ms)} ms, p99 ${ms(s.p99_ms)} ms)`,
    );
  }
  return lines;
}

/**
 * Tenants: calls in flight and queued now (counted for tenants with a quota), calls stored in the
 * calls stream now (every tenant; `calls/sessions, most of one session`), what quotas refused.
 */
export function renderTenants(tenants: readonly TenantStats[]): string[] {
  const rows = tenants.map((t) => [
    t.tenant,
    String(t.in_flight),
    String(t.queued),
    t.stored.calls === 0
      ? "0"
      : `${t.stored.calls}/${t.stored.sessions} max ${t.stored.max_session}`,
    Object.entries(t.refused)
      .map(([reason, n]) => `${reason} ${n}`)
      .join(", ") || "0",
  ]);
  const header = ["TENANT", "INFLIGHT", "QUEUED", "STORED", "REFUSED"];
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? "").length)));
  return [header, ...rows].map((cells) =>
    cells
      .map((c, i) =>
        i === 0 || i === cells.length - 1 ? c.padEnd(widths[i] ?? 0) : c.padStart(widths[i] ?? 0),
      )
      .join("  ")
      .trimEnd(),
  );
}

function summarizeServices(stats: MeshStats): string {
  const counts = new Map<string, number>();
  for (const s of stats.services) counts.set(s.service, (counts.get(s.service) ?? 0) + 1);
  return [...counts].map(([service, n]) => `${service} ×${n}`).join(", ");
}

/** Registers `toolmesh stats`. */
export function addStatsCommand(
  program: Command,
  config: () => RuntimeConfig,
  run: (command: () => Promise<number>) => void,
): void {
  program
    .command("stats")
    .description(
      "per tool: calls, error rate, p50/p99, in flight, queue depth, executors — from every service and JetStream",
    )
    .option("--json", "print one JSON object")
    .option("--tenant <id>", "in the tenants table, only this tenant")
    .action((o: { json?: boolean; tenant?: string }) => run(() => statsCommand(config(), o)));
}
