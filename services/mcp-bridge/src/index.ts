export { startBridge } from "./bridge.js";
export { meshToolName, ownerOf } from "./served-server.js";
export type { Bridge, BridgeOptions, ServerStatus } from "./bridge.js";
export {
  AuthSchema,
  DeclaredToolSchema,
  McpConfigError,
  McpServerConfigSchema,
  SecretValueSchema,
  loadMcpServers,
  parseServerFile,
  readSecret,
} from "./config.js";
export type { LoadServersOptions, LoadedServer, McpServerConfig, SecretValue } from "./config.js";
export { IDEMPOTENCY_META_KEY, ServerConnection } from "./connection.js";
export type { ConnectionState, ServerConnectionOptions } from "./connection.js";
export { callError, resultContent, resultError } from "./result.js";
export { startBridgeFromRuntime } from "./from-runtime.js";
export { ServerApprovalsSchema, ToolPins, toolHash } from "./pins.js";
export type { ApprovedTool, PinCheck, ServerApprovals, UnapprovedTool } from "./pins.js";
