export { startExecutor, toolDefinitionOf } from "./executor.js";
export { handleWork, handlerError, retryDelay, toContent } from "./handle-work.js";
export type { ServedTool, WorkDeps } from "./handle-work.js";
export { AttemptTelemetry } from "./attempt-telemetry.js";
export { FreshWork } from "./fresh-work.js";
export type { Executor, ExecutorOptions } from "./executor.js";
export { ToolModuleSchema, defineTool } from "./tool-module.js";
export type { DefineToolOptions, ToolContext, ToolHandler, ToolModule } from "./tool-module.js";
export {
  DEFAULT_ACCEPT,
  ERROR_BODY_BYTES,
  UrlAllowList,
  invalidParameter,
  invokeHttp,
  retryAfterMs,
  textOf,
} from "./http-invoke.js";
export type { HttpEndpoint, HttpRequest } from "./http-invoke.js";
export { ServedTools } from "./served-tools.js";
export type { SyncLog, ToolSync } from "./served-tools.js";
export {
  PrivateAddressError,
  outboundFetch,
  trustedHostsOf,
  outboundPolicy,
  privateAddressCause,
  privateAddressDenied,
  privateRangeOf,
} from "./outbound.js";
export type { FetchLike, OutboundPolicy, PrivateAddressAllowance } from "./outbound.js";
