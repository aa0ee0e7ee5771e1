export { ToolLoadError, builtinToolSources, loadToolsDir } from "./load-tools.js";
export type { LoadedTool } from "./load-tools.js";
export { loadPresetsFile, startExecutorFromRuntime } from "./from-runtime.js";
export {
  NATIVE_METHODS,
  NativeToolFileSchema,
  httpToolSources,
  isOpenApiFile,
  loadNativeToolsDir,
} from "./native-tools.js";
export { loadToolSources } from "./tool-source.js";
export type {
  LoadLog,
  SourcedTool,
  ToolSource,
  ToolSourceKind,
  ToolSourceSettings,
} from "./tool-source.js";
export { EXECUTOR_SOURCE_KINDS } from "./source-kinds.js";
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
export { ToolModuleSchema, defineTool } from "@toolmesh/tool-host";
export type { DefineToolOptions, ToolContext, ToolHandler, ToolModule } from "@toolmesh/tool-host";
