import { ErrorCode, ToolmeshError } from "@toolmesh/protocol";

/** What a frontend knows about the model it is about to call. */
export interface ModelCapabilities {
  /** Whether the model (through its provider API) accepts native tool declarations. */
  supportsFunctionCalling: boolean;
}

/**
 * An agent's `output_strategy` (README.md#tool-groups-tool-sets-agents-and-schema-expansion), field names as in its YAML configuration.
 */
export interface StrategyConfig {
  /** Prefer the model's native function calling. */
  function_calling: boolean;
  /** When native function calling is wanted but unsupported, use the structured-output prompt. */
  fallback_to_structured_output: boolean;
}

/** The default strategy: native function calling, falling back to structured output. */
export const DEFAULT_STRATEGY_CONFIG: Readonly<StrategyConfig> = Object.freeze({
  function_calling: true,
  fallback_to_structured_output: true,
});

/**
 * How tools reach the model: `native` declares them through the provider's function-calling
 * API (`toOpenAITools` and siblings); `structured` puts them in the prompt (`renderToolPrompt`)
 * and reads calls back from the text (`parseToolCallsFromText`).
 */
export type OutputStrategy = "native" | "structured";

/**
 * Chooses the output strategy (README.md#tool-groups-tool-sets-agents-and-schema-expansion). `function_calling: false` → `structured`,
 * whatever the model supports. Wanted and supported → `native`. Wanted, unsupported and
 * `fallback_to_structured_output` → `structured`; without the fallback it throws
 * `invalid_request` (not retryable: the configuration has to change).
 */
export function chooseOutputStrategy(
  model: ModelCapabilities,
  config: StrategyConfig = DEFAULT_STRATEGY_CONFIG,
): OutputStrategy {
  if (!config.function_calling) return "structured";
  if (model.supportsFunctionCalling) return "native";
  if (config.fallback_to_structured_output) return "structured";
  throw new ToolmeshError(
    ErrorCode.InvalidRequest,
    "output_strategy wants native function calling, the model does not support it, and " +
      "fallback_to_structured_output is false: enable the fallback or choose a model with " +
      "function calling",
    {
      details: {
        function_calling: config.function_calling,
        fallback_to_structured_output: config.fallback_to_structured_output,
        supports_function_calling: model.supportsFunctionCalling,
      },
    },
  );
}
