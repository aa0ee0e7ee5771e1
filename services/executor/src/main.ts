import { runService } from "@toolmesh/runtime";
import { startExecutorFromRuntime } from "./from-runtime.js";

await runService("executor", process.env, startExecutorFromRuntime);
