import type { CatalogEntry, OutputStrategyConfig } from "@toolmesh/protocol";
import { ErrorCode, ToolmeshError } from "@toolmesh/protocol";
import type { AgentProfile } from "./config.js";
import type { AccessContext } from "./policy.js";
import { effectiveAgent, toolEnabled } from "./policy.js";
import type { RevisedTool } from "./schema.js";
import { compactCatalogEntry, expandedCatalogEntry } from "./schema.js";

/** What {@link buildCatalog} needs. */
export interface CatalogInput extends AccessContext {
  /** Every registered tool. */
  tools: Iterable<RevisedTool>;
  /** Tools whose full schema the session has already received: they come expanded. */
  expanded?: ReadonlySet<string>;
}

/** A catalog for one session or agent. */
export interface BuiltCatalog {
  /** The tools the session may call, compact unless already expanded for it. */
  tools: CatalogEntry[];
  /** The agent that bounds it. */
  agent: string | undefined;
  /** That agent's output strategy, when configured. */
  outputStrategy: OutputStrategyConfig | undefined;
  /** Tools the agent lists that are not registered. */
  unavailable: string[];
}

/**
 * The compact catalog (docs/protocol.md#schema-expansion-catalog-and-tool-groups): each tool the session may call — its agent lists it and one
 * of its groups is active — as name and one line; tools whose schema the session has received
 * come with it. With an agent, in the agent's order (its tool sets, then its tools); otherwise
 * by name.
 *
 * @throws ToolmeshError `permission_denied` for an unknown agent (when any agent is configured)
 *   or an agent other than the one the session is bound to.
 */
export function buildCatalog(input: CatalogInput): BuiltCatalog {
  const agentName = effectiveAgent("", input);
  const agent = agentName === undefined ? undefined : findAgent(agentName, input.agents);
  const byName = new Map<string, RevisedTool>();
  for (const tool of input.tools) byName.set(tool.definition.name, tool);

  const names = agent !== undefined ? agent.tools : [...byName.keys()].sort(byCodePoint);
  const tools: CatalogEntry[] = [];
  const unavailable: string[] = [];
  for (const name of names) {
    const tool = byName.get(name);
    if (tool === undefined) {
      unavailable.push(name);
      continue;
    }
    if (!toolEnabled(tool.definition, input.tenantGroups, input.session)) continue;
    tools.push(
      input.expanded?.has(name) === true ? expandedCatalogEntry(tool) : compactCatalogEntry(tool),
    );
  }
  return {
    tools,
    agent: agentName,
    outputStrategy: agent?.outputStrategy,
    unavailable,
  };
}

/**
 * The profile of a configured agent; `undefined` when no agent is configured at all (the name
 * is then only a label).
 *
 * @throws ToolmeshError `permission_denied` when agents are configured and none has the name.
 */
export function findAgent(
  name: string,
  agents: ReadonlyMap<string, AgentProfile>,
): AgentProfile | undefined {
  if (agents.size === 0) return undefined;
  const agent = agents.get(name);
  if (agent !== undefined) return agent;
  throw new ToolmeshError(
    ErrorCode.PermissionDenied,
    `unknown agent "${name}": no agent configuration defines it`,
    { details: { agent: name, reason: "unknown_agent" } },
  );
}

function byCodePoint(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}
