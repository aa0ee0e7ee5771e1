// The executor's tool sources, for tests that load one kind of source directly.
export { loadNativeToolsDir } from "./native-tools.js";
export type { NativeToolFile, NativeToolsOptions } from "./native-tools.js";
export { openApiToolSources } from "./openapi-tools.js";
export type { ToolSourceSettings } from "./tool-source.js";
