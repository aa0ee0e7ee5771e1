// One work message's handling and its parts, for tests that drive them without a work loop.
export { toolDefinitionOf } from "./executor.js";
export { handleWork } from "./handle-work.js";
export type { ServedTool, WorkDeps } from "./handle-work.js";
export { AttemptTelemetry } from "./attempt-telemetry.js";
export { FreshWork } from "./fresh-work.js";
export { retryAfterMs } from "./http-invoke.js";
