import type { CatalogEntry } from "@toolmesh/protocol";
import { createNameMap } from "@toolmesh/protocol";

/**
 * A catalog as a model provider may be handed it: each entry's `name` becomes the tool's
 * provider-safe name (matching `^[a-zA-Z0-9_-]{1,64}$`, as OpenAI and Anthropic require) and
 * `tool` keeps its mesh name, which calls name. The registry refuses a tool whose safe name
 * another tool has, so each safe name is `safeToolName(tool)`; two that raced past it are told
 * apart by a hash suffix rather than served under one name. A model's call by safe name maps
 * back by `tool` here, or by `ToolRegistry.toolOfSafeName`.
 */
export function withProviderSafeNames(entries: readonly CatalogEntry[]): CatalogEntry[] {
  const names = createNameMap(entries.map((entry) => entry.name));
  return entries.map((entry) => ({
    ...entry,
    name: names.toProvider.get(entry.name) ?? entry.name,
    tool: entry.name,
  }));
}
