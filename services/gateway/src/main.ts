import { runService } from "@toolmesh/runtime";
import { loadGatewayConfig } from "./config.js";
import { startGatewayFromRuntime } from "./from-runtime.js";

let config;
try {
  config = loadGatewayConfig(process.env);
} catch (err) {
  process.stderr.write(`toolmesh gateway: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exit(1);
}
const gatewayConfig = config;
await runService("gateway", process.env, (rt) => startGatewayFromRuntime(rt, gatewayConfig));
