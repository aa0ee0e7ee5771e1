import { runService } from "@toolmesh/runtime";
import { startResolverFromRuntime } from "./from-runtime.js";

await runService("resolver", process.env, startResolverFromRuntime);
