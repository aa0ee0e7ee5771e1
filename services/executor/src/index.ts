export { startExecutor, toolDefinitionOf } from "./executor.js";
export { handleWork, handlerError, retryDelay, toContent } from "./handle-work.js";
export type { ServedTool, WorkDeps } from "./handle-work.js";
export { AttemptTelemetry } from "./attempt-telemetry.js";
export { FreshWork } from "./fresh-work.js";
export type { Executor, ExecutorOptions } from "./executor.js";
export { ToolLoadError, builtinToolSources, loadToolsDir } from "./load-tools.js";
export type { LoadedTool } from "./load-tools.js";
export { ToolModuleSchema, defineTool } from "./tool-module.js";
export type { DefineToolOptions, ToolContext, ToolHandler, ToolModule } from "./tool-module.js";
export { loadPresetsFile, startExecutorFromRuntime } from "./from-runtime.js";
export {
  NATIVE_METHODS,
  NativeToolFileSchema,
  httpToolSources,
  isOpenApiFile,
  loadNativeToolsDir,
} from "./native-tools.js";
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
export { loadToolSources } from "./tool-source.js";
export type {
  LoadLog,
  SourcedTool,
  ToolSource,
  ToolSourceKind,
  ToolSourceSettings,
} from "./tool-source.js";
export { EXECUTOR_SOURCE_KINDS } from "./source-kinds.js";
export { ServedTools } from "./served-tools.js";
export type { SyncLog, ToolSync } from "./served-tools.js";
export {
  OpenApiSourceFileSchema,
  openApiToolSources,
  openApiTools,
  readOpenApiDocument,
  readOpenApiSourceFile,
} from "./openapi-tools.js";
export type {
  OpenApiSourceFile,
  OpenApiTools,
  OpenApiToolsOptions,
  OpenApiWarning,
} from "./openapi-tools.js";
export type { NativeMethod, NativeToolFile, NativeToolsOptions } from "./native-tools.js";
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
