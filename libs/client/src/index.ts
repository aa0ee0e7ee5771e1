export { Session, ToolmeshClient } from "./client.js";
export type {
  CallHandle,
  CallInput,
  Catalog,
  ClientOptions,
  SessionEvent,
  SubmitOptions,
} from "./client.js";
export type { GroupChanges } from "./expansion.js";
export { requestReply } from "@toolmesh/nats";
export { retryAfterMs } from "./retry-after.js";
export type { RequestReplyOptions } from "@toolmesh/nats";

// ---- Output strategies: catalog formats, provider tools, structured-output fallback ----
// Pure functions, no NATS (formats/).
export {
  COMPACT_SCHEMA_NOTE,
  DEFAULT_STRATEGY_CONFIG,
  MAX_PROVIDER_NAME_LENGTH,
  SUPPLEMENTED_SCHEMAS_HEADING,
  chooseOutputStrategy,
  compactEntry,
  compactParameters,
  createNameMap,
  declaredParameters,
  describeEntry,
  expandedEntry,
  formatCatalogFor,
  fromAnthropicContent,
  fromGeminiParts,
  fromOpenAIToolCalls,
  isExpanded,
  parseToolCallsFromText,
  providerSafeName,
  renderSupplementedSchemas,
  renderToolPrompt,
  toAnthropicTools,
  toGeminiSchema,
  toGeminiTools,
  toOpenAITools,
  toolNameOf,
} from "./formats/index.js";
export type {
  AnthropicContentBlock,
  AnthropicTool,
  CatalogEntry,
  FormatCatalogOptions,
  FormattedCatalog,
  GeminiFunctionCall,
  GeminiFunctionDeclaration,
  GeminiPart,
  GeminiPartsOptions,
  GeminiSchema,
  GeminiTool,
  ModelCapabilities,
  ModelConfig,
  NameMap,
  OpenAITool,
  OpenAIToolCallInput,
  OutputStrategy,
  ParseToolCallsOptions,
  ParsedToolCalls,
  ProviderName,
  ProviderTools,
  StrategyConfig,
  SupplementedSchema,
  ToolPromptOptions,
} from "./formats/index.js";
