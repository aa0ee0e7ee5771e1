import { runService } from "@toolmesh/runtime";
import { startBridgeFromRuntime } from "./from-runtime.js";

await runService("mcp-bridge", process.env, startBridgeFromRuntime);
