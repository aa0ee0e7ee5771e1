// The Markdown report of a run, its latency CDF charts (SVG, drawn here), and the smoke check.
import { writeFileSync } from "node:fs";
import { join } from "node:path";

const COLORS = [
  "#1f77b4",
  "#d62728",
  "#2ca02c",
  "#9467bd",
  "#ff7f0e",
  "#8c564b",
  "#e377c2",
  "#17becf",
];

/** A CDF chart: latency (log scale) across, fraction of calls up; one line per system. */
export function cdfSvg(title, series) {
  const W = 760;
  const H = 420;
  const L = 60;
  const R = 180;
  const T = 36;
  const B = 50;
  const all = series.flatMap((s) => s.cdf.map(([, ms]) => ms)).filter((x) => x > 0);
  const lo = 10 ** Math.floor(Math.log10(Math.min(...all)));
  const hi = 10 ** Math.ceil(Math.log10(Math.max(...all)));
  const x = (ms) =>
    L +
    ((Math.log10(Math.max(ms, lo)) - Math.log10(lo)) / (Math.log10(hi) - Math.log10(lo))) *
      (W - L - R);
  const y = (p) => T + (1 - p / 100) * (H - T - B);
  const parts = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" font-family="sans-serif" font-size="12">`,
    `<rect width="${W}" height="${H}" fill="white"/>`,
    `<text x="${L}" y="20" font-size="14">${esc(title)}</text>`,
  ];
  for (let d = lo; d <= hi * 1.0001; d *= 10) {
    parts.push(`<line x1="${x(d)}" y1="${T}" x2="${x(d)}" y2="${H - B}" stroke="#ddd"/>`);
    parts.push(
      `<text x="${x(d)}" y="${H - B + 16}" text-anchor="middle">${d >= 1 ? d : d.toPrecision(1)} ms</text>`,
    );
  }
  for (const p of [0, 25, 50, 75, 90, 99, 100]) {
    parts.push(`<line x1="${L}" y1="${y(p)}" x2="${W - R}" y2="${y(p)}" stroke="#eee"/>`);
    parts.push(`<text x="${L - 6}" y="${y(p) + 4}" text-anchor="end">${p}%</text>`);
  }
  parts.push(
    `<text x="${(L + W - R) / 2}" y="${H - 12}" text-anchor="middle">latency (log scale)</text>`,
  );
  series.forEach((s, i) => {
    const color = COLORS[i % COLORS.length];
    const pts = s.cdf.map(([p, ms]) => `${x(ms).toFixed(1)},${y(p).toFixed(1)}`).join(" ");
    parts.push(`<polyline fill="none" stroke="${color}" stroke-width="2" points="${pts}"/>`);
    parts.push(`<rect x="${W - R + 12}" y="${T + i * 20}" width="14" height="4" fill="${color}"/>`);
    parts.push(`<text x="${W - R + 32}" y="${T + i * 20 + 6}">${esc(s.label)}</text>`);
  });
  parts.push("</svg>");
  return `${parts.join("\n")}\n`;
}

function esc(s) {
  return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;");
}

const f = (x, d = 2) => (x === undefined || x === null ? "—" : Number(x).toFixed(d));

/** Writes `bench-<mode>-<stamp>.md` and its charts; returns the Markdown path. */
export function writeReport(result, dir, stamp) {
  const names = Object.keys(result.systems);
  const charts = [
    ["sequential", `Sequential calls, 1 KB (one at a time)`],
    ["open", `Open loop, ${result.plan.rate} calls/s, latency from the scheduled send time`],
  ];
  const lines = [
    `# toolmesh benchmark — ${result.mode}, ${result.started_at}`,
    "",
    `Node ${result.machine.node}, ${result.machine.cpus} CPUs (shared: compare ratios, not times). ` +
      `${result.plan.rounds} alternating rounds; per round and system: ${result.plan.seq} sequential calls, ` +
      `${result.plan.closedMs / 1000} s closed loop at ${result.plan.inFlight} in flight, ` +
      `${result.plan.openMs / 1000} s open loop at ${result.plan.rate}/s. Payload 1 KB unless said.`,
    "",
    "| system | what | seq p50 | p90 | p99 | p99.9 | calls/s (64 in flight) | open p50 | open p99 | open p99.9 | timeouts | CPU µs/call | server in msgs/call | out msgs/call |",
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
  ];
  for (const n of names) {
    const s = result.systems[n];
    lines.push(
      `| ${n} | ${s.title} | ${f(s.sequential.p50_ms, 3)} | ${f(s.sequential.p90_ms, 3)} | ${f(s.sequential.p99_ms, 3)} | ${f(s.sequential.p999_ms, 3)} | ${s.closed.calls_per_s} | ${f(s.open.p50_ms, 3)} | ${f(s.open.p99_ms, 3)} | ${f(s.open.p999_ms, 3)} | ${s.open.timeouts} | ${f(s.cost.cpu_us_per_call, 0)} | ${f(s.cost.server_in_msgs_per_call)} | ${f(s.cost.server_out_msgs_per_call)} |`,
    );
  }
  lines.push(
    "",
    "Latencies in ms. CPU and server messages per completed call of the closed loop (counted from a moment when nothing is in flight to the moment nothing is), over every process of the system: the driver (client), its workers and its server. Timeouts: open-loop calls not answered within 10 s.",
    "",
  );
  lines.push(
    "## Ratios (same run)",
    "",
    "| | sequential p50 | throughput | open-loop p99 | CPU per call | server msgs per call (difference) |",
    "| --- | --- | --- | --- | --- | --- |",
  );
  for (const [k, r] of Object.entries(result.ratios)) {
    lines.push(
      `| ${k.replace(/_/g, " ")} | ${f(r.sequential_p50)} | ${f(r.throughput)} | ${f(r.open_p99)} | ${f(r.cpu_per_call)} | ${f(r.server_in_msgs_per_call)} |`,
    );
  }
  lines.push("");
  for (const [key, title] of charts) {
    const file = `bench-${result.mode}-${stamp}-${key}.svg`;
    writeFileSync(
      join(dir, file),
      cdfSvg(
        title,
        names.map((n) => ({ label: n, cdf: result.systems[n][key].cdf ?? [] })),
      ),
    );
    lines.push(`![${title}](${file})`, "");
  }
  lines.push("## CPU per call by process (µs, closed loop)", "");
  for (const n of names) {
    const by = result.systems[n].cost.cpu_us_by_process ?? {};
    lines.push(
      `- ${n}: ${Object.entries(by)
        .map(([k, v]) => `${k} ${f(v, 0)}`)
        .join(", ")}`,
    );
  }
  const sizes = names.filter((n) => result.systems[n].payload_sizes !== undefined);
  if (sizes.length > 0) {
    const keys = Object.keys(result.systems[sizes[0]].payload_sizes);
    lines.push(
      "",
      "## Payload size, sequential p50 (ms)",
      "",
      `| system | ${keys.map((k) => `${k} B`).join(" | ")} |`,
      `| --- | ${keys.map(() => "---").join(" | ")} |`,
    );
    for (const n of sizes)
      lines.push(
        `| ${n} | ${keys.map((k) => f(result.systems[n].payload_sizes[k].p50_ms, 3)).join(" | ")} |`,
      );
  }
  // An extra that failed is reported as such (run.mjs keeps its error), not with its figures.
  const x = {};
  lines.push("", "## Mesh extras", "");
  for (const [key, value] of Object.entries(result.extras)) {
    if (value?.error === undefined) x[key] = value;
    else lines.push(`- ${key.replace(/_/g, " ")}: failed (${value.error}).`);
  }
  if (x.idle_mesh)
    lines.push(
      `- Idle mesh (resolver + executor, no calls, ${x.idle_mesh.seconds} s): ${x.idle_mesh.in_msgs_per_s} client→server and ${x.idle_mesh.out_msgs_per_s} server→client messages per second.`,
    );
  if (x.first_call)
    lines.push(
      `- First call to a tool that appeared while the mesh ran vs the same tool warm: ${x.first_call.map((c) => `${f(c.first_ms)} ms vs p50 ${f(c.warm_p50_ms)} ms`).join("; ")}.`,
    );
  if (x.schema_expansion)
    lines.push(
      `- Schema expansion (call without its required arguments): \`missing_arguments\` p50 ${f(x.schema_expansion.to_missing_arguments.p50_ms)} ms (p99 ${f(x.schema_expansion.to_missing_arguments.p99_ms)}), the schema on the session p50 ${f(x.schema_expansion.to_schema.p50_ms)} ms (p99 ${f(x.schema_expansion.to_schema.p99_ms)}).`,
    );
  if (x.memory)
    lines.push(
      `- Memory at ${x.memory.in_flight} calls in flight: ${x.memory.bytes_per_call_services} bytes per call over all services (by process: ${Object.entries(
        x.memory.bytes_per_call_by_process,
      )
        .map(([k, v]) => `${k} ${v}`)
        .join(
          ", ",
        )}; the driver is the client, not counted in the total). RSS grows by heap the collector has not given back yet; heap still in use after a full collection: ${Object.entries(
        x.memory.heap_retained_bytes_per_call_by_service ?? {},
      )
        .map(([k, v]) => `${k} ${v}`)
        .join(", ")} bytes per call.`,
    );
  for (const n of names)
    if (result.systems[n].otlp_sink)
      lines.push(
        `- ${n}: the OTLP sink received ${result.systems[n].otlp_sink.requests} exports (${result.systems[n].otlp_sink.bytes} bytes).`,
      );
  for (const [k, v] of Object.entries(x)) if (v?.error) lines.push(`- ${k} failed: ${v.error}`);
  if (x.bullmq_skipped) lines.push(`- BullMQ skipped: ${x.bullmq_skipped}`);
  const path = join(dir, `bench-${result.mode}-${stamp}.md`);
  writeFileSync(path, `${lines.join("\n")}\n`);
  return path;
}

/**
 * The smoke check: each threshold bounds a ratio of the mesh to a baseline measured in the same
 * run (never an absolute time), or the server messages per call (a count). Returns what failed.
 */
export function checkThresholds(result, t) {
  const failures = [];
  const r = result.ratios;
  const check = (label, value, limit, worseIfAbove) => {
    if (value === undefined || limit === undefined) return;
    if (worseIfAbove ? value > limit : value < limit)
      failures.push(`${label} = ${value}, limit ${worseIfAbove ? "≤" : "≥"} ${limit}`);
  };
  for (const base of ["R", "J", "B"]) {
    const ratio = r[`M_vs_${base}`];
    const lim = t[`M_vs_${base}`];
    if (ratio === undefined || lim === undefined) continue;
    check(`sequential p50 M/${base}`, ratio.sequential_p50, lim.max_sequential_p50, true);
    check(`throughput M/${base}`, ratio.throughput, lim.min_throughput, false);
    check(`CPU per call M/${base}`, ratio.cpu_per_call, lim.max_cpu_per_call, true);
  }
  const m = result.systems.M;
  check(
    "server in msgs per call (M)",
    m?.cost.server_in_msgs_per_call,
    t.max_server_in_msgs_per_call,
    true,
  );
  if ((m?.open.timeouts ?? 0) > 0)
    failures.push(`${m.open.timeouts} calls timed out or failed in the open loop`);
  return failures;
}
