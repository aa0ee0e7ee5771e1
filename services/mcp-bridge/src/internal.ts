// The bridge's parts, for tests that drive one MCP server connection or name its tools.
export { ServerConnection } from "./connection.js";
export type { ConnectionState, ServerConnectionOptions } from "./connection.js";
export { meshToolName } from "./served-server.js";
