export { ConfigError, EnvSchema, loadConfig } from "./config.js";
export type { RuntimeConfig } from "./config.js";
export {
  StartupTimeoutError,
  installShutdown,
  openRuntime,
  runService,
  serveActors,
} from "./runtime.js";
export type { OpenRuntimeOptions, Runtime, Stoppable } from "./runtime.js";
export { startHealthServer } from "./health.js";
export type { HealthState } from "./health.js";
