import type { CatalogEntry } from "./catalog.js";
import type { ToolPromptOptions } from "./fallback.js";
import { renderToolPrompt } from "./fallback.js";
import type { AnthropicTool, GeminiTool, NameMap, OpenAITool, ProviderName } from "./providers.js";
import { toAnthropicTools, toGeminiTools, toOpenAITools } from "./providers.js";
import type { StrategyConfig } from "./strategy.js";
import { DEFAULT_STRATEGY_CONFIG, chooseOutputStrategy } from "./strategy.js";
import type { SupplementedSchema } from "./supplemented.js";
import { renderSupplementedSchemas } from "./supplemented.js";

/** What a frontend's configuration says about the model it calls. */
export interface ModelConfig {
  /** Whose native function-calling shape to use. */
  provider: ProviderName;
  /** Whether the model accepts native tool declarations (`supports_function_calling`, README.md#tool-groups-tool-sets-agents-and-schema-expansion). */
  supportsFunctionCalling: boolean;
  /** The agent's `output_strategy`; default native, falling back to structured output. */
  outputStrategy?: StrategyConfig | undefined;
}

/** Options of {@link formatCatalogFor}. */
export interface FormatCatalogOptions extends ToolPromptOptions {
  /**
   * Schemas the session received since the last turn (`session.takeSupplementedSchemas()`):
   * their tools are declared expanded and the section explaining them is returned as
   * `supplement`.
   */
  supplemented?: readonly SupplementedSchema[];
}

/** A catalog ready for one model request. */
export type FormattedCatalog = (
  | { strategy: "native"; provider: "openai"; tools: OpenAITool[]; nameMap: NameMap }
  | { strategy: "native"; provider: "anthropic"; tools: AnthropicTool[]; nameMap: NameMap }
  | { strategy: "native"; provider: "gemini"; tools: GeminiTool[]; nameMap: NameMap }
  | {
      strategy: "structured";
      /** The tools section of the system prompt (`renderToolPrompt`). */
      prompt: string;
    }
) & {
  /** The supplemented-schemas section (docs/protocol.md, schema expansion) for the system prompt, `""` when there is none. */
  supplement: string;
};

/**
 * Formats a catalog for a model: chooses the output strategy from the model's function-calling
 * support and the agent's `output_strategy` (`chooseOutputStrategy`), then gives the provider's
 * native tool declarations or the structured-output prompt. Entries named in `supplemented` are
 * declared with their full schema.
 *
 * @throws ToolmeshError `invalid_request` when native function calling is required (no fallback)
 *   and the model does not support it.
 */
export function formatCatalogFor(
  model: ModelConfig,
  entries: readonly CatalogEntry[],
  options: FormatCatalogOptions = {},
): FormattedCatalog {
  const strategy = chooseOutputStrategy(
    { supportsFunctionCalling: model.supportsFunctionCalling },
    model.outputStrategy ?? DEFAULT_STRATEGY_CONFIG,
  );
  const supplemented = options.supplemented ?? [];
  const byTool = new Map(supplemented.map((s) => [s.tool, s]));
  const declared = entries.map((entry): CatalogEntry => {
    const schema = byTool.get(entry.name);
    if (schema === undefined) return entry;
    return {
      ...entry,
      parameters: schema.parameters,
      ...(schema.description === undefined ? {} : { description: schema.description }),
    };
  });
  const supplement = renderSupplementedSchemas(supplemented);
  if (strategy === "structured") {
    return { strategy, prompt: renderToolPrompt(declared, options), supplement };
  }
  switch (model.provider) {
    case "openai":
      return { strategy, provider: "openai", ...toOpenAITools(declared), supplement };
    case "anthropic":
      return { strategy, provider: "anthropic", ...toAnthropicTools(declared), supplement };
    case "gemini":
      return { strategy, provider: "gemini", ...toGeminiTools(declared), supplement };
  }
}
