export { AuthError, Authenticator, keyDigest, loadKeysFile } from "./auth.js";
export type { Principal } from "./auth.js";
export { GatewayConfigError, GatewayEnvSchema, loadGatewayConfig } from "./config.js";
export type { GatewayConfig, JwtSettings } from "./config.js";
export { createGatewayServer } from "./gateway.js";
export type { GatewayServer, GatewayServerOptions } from "./gateway.js";
export { gatewayVersion, startGatewayFromRuntime } from "./from-runtime.js";
export type { Gateway } from "./from-runtime.js";
export { CredentialLimits } from "./limits.js";
export { MeshCredentialLimits } from "./mesh-limits.js";
export type { CredentialLimitsOptions, LimitRefusal } from "./limits.js";
export {
  META_IDEMPOTENCY_KEY,
  META_TIMEOUT_MS,
  MeshView,
  PAGE_SIZE,
  TASK_POLL_INTERVAL_MS,
  isMeshCallId,
} from "./mesh-view.js";
export type { MeshViewOptions } from "./mesh-view.js";
export { errorResult, toCallToolResult } from "./results.js";
