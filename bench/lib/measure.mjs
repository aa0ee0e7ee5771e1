// What the suite measures with: HDR histograms (perf_hooks), CPU and memory of processes from
// /proc, and nats-server's own message counters from its monitoring endpoint.
import { readFileSync } from "node:fs";
import { createHistogram, performance } from "node:perf_hooks";

/** Clock ticks per second of /proc/<pid>/stat (USER_HZ, 100 on Linux). */
const TICKS_PER_S = 100;

/** CPU seconds (user + system) a process has used so far; 0 once it is gone. */
export function cpuSeconds(pid) {
  if (pid === process.pid) {
    const u = process.cpuUsage();
    return (u.user + u.system) / 1e6;
  }
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // Fields after the command name (which may hold spaces) start after the last ')'.
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return (Number(fields[11]) + Number(fields[12])) / TICKS_PER_S;
  } catch {
    return 0;
  }
}

/** Resident memory of a process, in bytes. */
export function rssBytes(pid) {
  try {
    const status = readFileSync(`/proc/${pid}/status`, "utf8");
    const kb = /VmRSS:\s+(\d+)/.exec(status)?.[1];
    return kb === undefined ? 0 : Number(kb) * 1024;
  } catch {
    return 0;
  }
}

/** The server's counters of messages received from and sent to clients. */
export async function varz(monitorUrl) {
  const res = await globalThis.fetch(`${monitorUrl}/varz`);
  const v = await res.json();
  return { in_msgs: v.in_msgs, out_msgs: v.out_msgs, in_bytes: v.in_bytes, out_bytes: v.out_bytes };
}

/** Snapshots CPU of some processes (by role) and the server's counters, to diff later. */
export async function snapshot(system) {
  const cpu = {};
  for (const [role, pid] of Object.entries(system.pids())) cpu[role] = cpuSeconds(pid);
  const server = system.monitorUrl === undefined ? undefined : await varz(system.monitorUrl);
  return { at: performance.now(), cpu, server };
}

/** CPU per call (µs, per role and in total) and server messages per call between two snapshots. */
export function costPerCall(before, after, calls) {
  const cpu_us = {};
  let total = 0;
  for (const role of Object.keys(after.cpu)) {
    const s = Math.max(0, after.cpu[role] - (before.cpu[role] ?? 0));
    cpu_us[role] = round((s * 1e6) / calls, 1);
    total += s;
  }
  const out = { cpu_us_per_call: round((total * 1e6) / calls, 1), cpu_us_by_process: cpu_us };
  if (before.server !== undefined && after.server !== undefined) {
    out.server_in_msgs_per_call = round((after.server.in_msgs - before.server.in_msgs) / calls, 2);
    out.server_out_msgs_per_call = round(
      (after.server.out_msgs - before.server.out_msgs) / calls,
      2,
    );
  }
  return out;
}

export function round(x, digits = 3) {
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

/** A latency histogram in µs (HDR, 3 significant digits). */
export function newHistogram() {
  return createHistogram({ lowest: 1, highest: 120_000_000, figures: 3 });
}

/** p50/p90/p99/p99.9 in ms, and the CDF points for the chart. */
export function summarize(h) {
  if (h.count === 0) return { count: 0 };
  const ms = (us) => round(us / 1000, 3);
  const cdf = [];
  for (const [p, v] of h.percentiles) cdf.push([round(p, 4), ms(v)]);
  return {
    count: h.count,
    p50_ms: ms(h.percentile(50)),
    p90_ms: ms(h.percentile(90)),
    p99_ms: ms(h.percentile(99)),
    p999_ms: ms(h.percentile(99.9)),
    max_ms: ms(h.max),
    cdf,
  };
}

function recordSince(h, t0) {
  h.record(Math.max(1, Math.round((performance.now() - t0) * 1000)));
}

/** One call at a time. */
export async function sequential(call, n, payload) {
  const h = newHistogram();
  const started = performance.now();
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    await call(payload);
    recordSince(h, t0);
  }
  const calls_per_s = Math.round(n / ((performance.now() - started) / 1000));
  return { ...summarize(h), calls_per_s, hist: h };
}

/** Closed loop: `inFlight` callers, each sending its next call when the last one answered. */
export async function closedLoop(call, { inFlight, durationMs, payload }) {
  const h = newHistogram();
  const started = performance.now();
  const until = started + durationMs;
  let calls = 0;
  await Promise.all(
    Array.from({ length: inFlight }, async () => {
      while (performance.now() < until) {
        const t0 = performance.now();
        await call(payload);
        recordSince(h, t0);
        calls++;
      }
    }),
  );
  const elapsed = performance.now() - started;
  return { calls, calls_per_s: Math.round(calls / (elapsed / 1000)), ...summarize(h), hist: h };
}

/**
 * Open loop at a fixed rate: call i is due at start + i/rate and its latency counts from that
 * scheduled time, so a stalled system is charged for the calls it delayed (no coordinated
 * omission). Calls not answered within `timeoutMs` count as timeouts.
 */
export async function openLoop(call, { rate, durationMs, payload, timeoutMs = 10_000 }) {
  const h = newHistogram();
  const n = Math.round((rate * durationMs) / 1000);
  const started = performance.now();
  let timeouts = 0;
  let errors = 0;
  const pending = [];
  let i = 0;
  await new Promise((resolve) => {
    const tick = () => {
      const now = performance.now();
      while (i < n && started + (i * 1000) / rate <= now) {
        const due = started + (i * 1000) / rate;
        let timer;
        const timeout = new Promise((r) => (timer = setTimeout(() => r("timeout"), timeoutMs)));
        pending.push(
          Promise.race([call(payload).then(() => "ok"), timeout]).then(
            (outcome) => {
              clearTimeout(timer);
              if (outcome === "timeout") timeouts++;
              else recordSince(h, due);
            },
            () => {
              clearTimeout(timer);
              errors++;
            },
          ),
        );
        i++;
      }
      // Sleep until the next call is due (ms timers: up to ~1 ms late, the same for every system).
      if (i < n) setTimeout(tick, Math.max(0, started + (i * 1000) / rate - performance.now()));
      else resolve();
    };
    tick();
  });
  await Promise.all(pending);
  return { rate, calls: n, timeouts, errors, ...summarize(h), hist: h };
}

/** The median of some numbers (the mean of the middle two when their count is even). */
export function median(values) {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
}

/** Of several {@link phase} results, the one with the most calls per second. */
export function fastest(phases) {
  return phases.reduce((a, b) => (b.calls_per_s > a.calls_per_s ? b : a));
}

/**
 * One phase of a with/without comparison: `sequentialCalls` calls one at a time (their p50),
 * then a closed loop of 64 in flight for `loopMs` (its throughput); logs both under `label`.
 * With `system` (a mesh of `startMesh`), also the CPU per call of each of its processes through
 * the closed loop: where a difference between two sides is spent.
 */
export async function phase(call, { label, sequentialCalls, loopMs, payload, log, system }) {
  const seq = await sequential(call, sequentialCalls, payload);
  const before = system === undefined ? undefined : await snapshot(system);
  const loop = await closedLoop(call, { inFlight: 64, durationMs: loopMs, payload });
  // CPU per call of each process through the closed loop, when the system's processes are known.
  const cost =
    before === undefined ? undefined : costPerCall(before, await snapshot(system), loop.calls);
  log(
    `${label}: p50 ${round(seq.p50_ms)} ms, ${loop.calls_per_s} calls/s` +
      (cost === undefined ? "" : `, CPU µs per call ${JSON.stringify(cost.cpu_us_by_process)}`),
  );
  return {
    p50_ms: seq.p50_ms,
    calls_per_s: loop.calls_per_s,
    ...(cost === undefined ? {} : { cpu_us_by_process: cost.cpu_us_by_process }),
    ...(cost?.server_in_msgs_per_call === undefined
      ? {}
      : {
          server_msgs_per_call: {
            in: cost.server_in_msgs_per_call,
            out: cost.server_out_msgs_per_call,
          },
        }),
  };
}
