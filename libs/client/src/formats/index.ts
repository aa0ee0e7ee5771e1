export {
  COMPACT_SCHEMA_NOTE,
  compactEntry,
  compactParameters,
  declaredParameters,
  describeEntry,
  expandedEntry,
  isExpanded,
} from "./catalog.js";
export type { CatalogEntry } from "./catalog.js";
export {
  MAX_PROVIDER_NAME_LENGTH,
  createNameMap,
  fromAnthropicContent,
  fromGeminiParts,
  fromOpenAIToolCalls,
  providerSafeName,
  toAnthropicTools,
  toGeminiSchema,
  toGeminiTools,
  toOpenAITools,
  toolNameOf,
} from "./providers.js";
export type {
  AnthropicContentBlock,
  AnthropicTool,
  GeminiFunctionCall,
  GeminiFunctionDeclaration,
  GeminiPart,
  GeminiPartsOptions,
  GeminiSchema,
  GeminiTool,
  NameMap,
  OpenAITool,
  OpenAIToolCallInput,
  ProviderName,
  ProviderTools,
} from "./providers.js";
export { DEFAULT_STRATEGY_CONFIG, chooseOutputStrategy } from "./strategy.js";
export type { ModelCapabilities, OutputStrategy, StrategyConfig } from "./strategy.js";
export { parseToolCallsFromText, renderToolPrompt } from "./fallback.js";
export type { ParseToolCallsOptions, ParsedToolCalls, ToolPromptOptions } from "./fallback.js";
export { SUPPLEMENTED_SCHEMAS_HEADING, renderSupplementedSchemas } from "./supplemented.js";
export type { SupplementedSchema } from "./supplemented.js";
export { formatCatalogFor } from "./format-for.js";
export type { FormatCatalogOptions, FormattedCatalog, ModelConfig } from "./format-for.js";
