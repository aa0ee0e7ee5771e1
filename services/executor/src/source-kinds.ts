import { builtinToolSources } from "./load-tools.js";
import { httpToolSources } from "./native-tools.js";
import { openApiToolSources } from "./openapi-tools.js";
import type { ToolSourceKind } from "./tool-source.js";

/**
 * The kinds of tool source an executor loads, in order: a name defined by an earlier kind
 * wins over a later one. A new kind of tool is one module exporting a `ToolSourceKind` and
 * one line here. (MCP servers are a kind too, loaded by the mcp-bridge, which gives each
 * server its own executor.)
 */
export const EXECUTOR_SOURCE_KINDS: readonly ToolSourceKind[] = [
  builtinToolSources,
  httpToolSources,
  openApiToolSources,
];
