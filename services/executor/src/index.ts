// The executor: what a process hosting it starts, the API a tool module is written against, and
// the OpenAPI import `toolmesh import-openapi` uses.
export { startExecutorFromRuntime } from "./from-runtime.js";
export { ToolModuleSchema, defineTool } from "@toolmesh/tool-host";
export type { DefineToolOptions, ToolContext, ToolHandler, ToolModule } from "@toolmesh/tool-host";
export { ToolLoadError } from "./load-tools.js";
export { OpenApiSourceFileSchema, openApiTools, readOpenApiDocument } from "./openapi-tools.js";
export type {
  OpenApiSourceFile,
  OpenApiTools,
  OpenApiToolsOptions,
  OpenApiWarning,
} from "./openapi-tools.js";
