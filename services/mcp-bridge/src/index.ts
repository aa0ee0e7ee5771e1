// The mcp-bridge: what a process hosting it starts, and the tool pins `toolmesh approve` writes.
export { startBridge } from "./bridge.js";
export type { Bridge, BridgeOptions, ServerStatus } from "./bridge.js";
export { startBridgeFromRuntime } from "./from-runtime.js";
export { McpServerConfigSchema } from "./config.js";
export type { McpServerConfig } from "./config.js";
export { ToolPins } from "./pins.js";
export type { ApprovedTool, PinCheck, ServerApprovals, UnapprovedTool } from "./pins.js";
