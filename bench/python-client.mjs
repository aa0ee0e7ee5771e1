// The Python client against the TypeScript client, on one mesh in one run: sequential echo
// calls (p50, p90, p99) and a closed loop at 64 in flight (calls/s), in rounds (3; 1 with
// --smoke) where each client goes first in every other round, then the median of the ratios.
// `node bench/python-client.mjs [--smoke] [--python PATH]` after `npm run build` and installing
// clients/python (its virtualenv's python is the default: clients/python/.venv/bin/python).
import { spawn } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { benchFlags } from "./lib/flags.mjs";
import { closedLoop, median, round, sequential } from "./lib/measure.mjs";

const ratio = (x) => round(x, 2);
import { payloadOf, startMesh } from "./lib/systems.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
const { values: flags } = benchFlags({
  options: {
    smoke: { type: "boolean", default: false },
    python: {
      type: "string",
      default: join(HERE, "..", "clients", "python", ".venv", "bin", "python"),
    },
  },
});
const plan = flags.smoke
  ? { rounds: 1, seq: 200, inFlight: 64, closedMs: 2_000 }
  : { rounds: 3, seq: 500, inFlight: 64, closedMs: 4_000 };
const log = (...a) => process.stderr.write(`${a.join(" ")}\n`);

function runPython(url) {
  return new Promise((resolve, reject) => {
    const child = spawn(
      flags.python,
      [
        join(HERE, "python", "client_bench.py"),
        url,
        String(plan.seq),
        String(plan.inFlight),
        String(plan.closedMs / 1000),
      ],
      { stdio: ["ignore", "pipe", "inherit"] },
    );
    let out = "";
    child.stdout.setEncoding("utf8");
    child.stdout.on("data", (chunk) => (out += chunk));
    child.on("error", reject);
    child.on("exit", (code) =>
      code === 0
        ? resolve(JSON.parse(out.trim().split("\n").pop()))
        : reject(new Error(`python exited ${code}`)),
    );
  });
}

const mesh = await startMesh({ name: "M", concurrency: 64 });
try {
  const payload = payloadOf(1024);
  // Alternating rounds, so load that comes and goes on a shared machine falls on both clients.
  const rounds = [];
  for (let round = 1; round <= plan.rounds; round++) {
    // Each client goes first in every other round: load that fades favours neither.
    const measureTs = async () => {
      log(`round ${round}: TypeScript client`);
      const seq = await sequential((p) => mesh.call(p), plan.seq, payload);
      const closed = await closedLoop((p) => mesh.call(p), {
        inFlight: plan.inFlight,
        durationMs: plan.closedMs,
        payload,
      });
      return { seq, closed };
    };
    const measurePy = () => {
      log(`round ${round}: Python client`);
      return runPython(mesh.server.url);
    };
    let tsRun;
    let py;
    if (round % 2 === 1) {
      tsRun = await measureTs();
      py = await measurePy();
    } else {
      py = await measurePy();
      tsRun = await measureTs();
    }
    const { seq: tsSeq, closed: tsClosed } = tsRun;
    const ts = {
      sequential: {
        count: tsSeq.count,
        p50_ms: tsSeq.p50_ms,
        p90_ms: tsSeq.p90_ms,
        p99_ms: tsSeq.p99_ms,
        calls_per_s: tsSeq.calls_per_s,
      },
      closed_loop: {
        in_flight: plan.inFlight,
        calls: tsClosed.calls,
        calls_per_s: tsClosed.calls_per_s,
        p50_ms: tsClosed.p50_ms,
        p99_ms: tsClosed.p99_ms,
      },
    };
    rounds.push({
      typescript: ts,
      python: py,
      ratios: {
        sequential_p50_python_over_ts: ratio(py.sequential.p50_ms / ts.sequential.p50_ms),
        throughput_python_over_ts: ratio(py.closed_loop.calls_per_s / ts.closed_loop.calls_per_s),
      },
    });
  }
  const ratios = {
    sequential_p50_python_over_ts: median(
      rounds.map((r) => r.ratios.sequential_p50_python_over_ts),
    ),
    throughput_python_over_ts: median(rounds.map((r) => r.ratios.throughput_python_over_ts)),
  };
  process.stdout.write(`${JSON.stringify({ rounds, median_ratios: ratios }, null, 2)}\n`);
} finally {
  await mesh.stop();
}
