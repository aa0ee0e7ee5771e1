// Micro-benchmark of the resolver's hot path (no NATS): compile a tool once, then resolve
// calls against it. Prints µs per call; compare runs on the same machine, not absolutes.
import { performance } from "node:perf_hooks";
import { compileTool } from "@toolmesh/registry";
import { ToolDefinitionSchema } from "@toolmesh/protocol";
import { parseArguments, resolveCall } from "@toolmesh/resolver";
import optimize from "../tools/builtin/optimize-structure.js";

const definition = ToolDefinitionSchema.parse({
  name: optimize.name,
  description: optimize.description,
  summary: "bench",
  parameters: optimize.parameters,
  kind: "builtin",
  owner: "bench",
});

const compileStart = performance.now();
const tool = compileTool(definition, 1);
const compileMs = performance.now() - compileStart;

const args = JSON.stringify({ input_structure: "Cu.cif", model_path: "dpa.pt", relax_cell: false });
const request = {
  tool_call: { id: "c", type: "function", function: { name: optimize.name, arguments: args } },
  session_id: "s",
};
const options = {
  now: Date.now(),
  defaultTimeoutMs: 60_000,
  address: { tenant: "default", session: "s" },
};

const N = 200_000;
for (let i = 0; i < 20_000; i++) resolveCall(tool, request, parseArguments(args), options); // warm-up
const started = performance.now();
for (let i = 0; i < N; i++) resolveCall(tool, request, parseArguments(args), options);
const elapsed = performance.now() - started;

console.log(
  JSON.stringify({
    bench: "resolve",
    compile_ms: Number(compileMs.toFixed(2)),
    calls: N,
    us_per_call: Number(((elapsed * 1000) / N).toFixed(2)),
    calls_per_s: Math.round(N / (elapsed / 1000)),
    heap_mb: Math.round(process.memoryUsage().heapUsed / 2 ** 20),
  }),
);
