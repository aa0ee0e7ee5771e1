export { ConfigError, EnvSchema, GatewayEnvSchema, loadConfig } from "./config.js";
export type { RuntimeConfig } from "./config.js";
export {
  StartupTimeoutError,
  installShutdown,
  meshAuditTrail,
  meshRegistry,
  meshSettings,
  openRuntime,
  ownerAccountOf,
  runService,
  serveActors,
  stopActor,
} from "./runtime.js";
export type { OpenRuntimeOptions, Runtime, Stoppable } from "./runtime.js";
export { Readiness, startHealthServer } from "./health.js";
export type { CheckResult, HealthState, ReadinessReport } from "./health.js";
export { packageVersion } from "./package-version.js";
