import { runService } from "@toolmesh/runtime";
import { startSchemaExpanderFromRuntime } from "./from-runtime.js";

await runService("schema-expander", process.env, startSchemaExpanderFromRuntime);
