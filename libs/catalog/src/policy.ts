import type { GroupState, ToolDefinition } from "@toolmesh/protocol";
import { ErrorCode, ToolmeshError } from "@toolmesh/protocol";
import type { AgentProfile } from "./config.js";

/** Group switches at one scope: group name → active. A group with no switch is active. */
export type GroupSwitches = ReadonlyMap<string, boolean>;

/** What restricts one session beyond its tenant: group overrides and a bound agent. */
export interface SessionPolicy {
  /** The agent the session is bound to: it may call only that agent's tools. */
  readonly agent?: string | undefined;
  /** Group switches for this session; they win over the tenant's. */
  readonly groups: GroupSwitches;
}

/** Everything that decides whether a session may call a tool. */
export interface AccessContext {
  /** The tenant's group switches (every session of the tenant). */
  readonly tenantGroups?: GroupSwitches | undefined;
  /** The session's own policy. */
  readonly session?: SessionPolicy | undefined;
  /** The agent the call (or request) names, if any. */
  readonly agent?: string | undefined;
  /** The configured agents. With none configured, agent names restrict nothing. */
  readonly agents: ReadonlyMap<string, AgentProfile>;
}

/** Whether a group is active and which scope said so. */
export function groupActivity(
  group: string,
  tenantGroups: GroupSwitches | undefined,
  session: SessionPolicy | undefined,
): { active: boolean; source: GroupState["source"] } {
  const bySession = session?.groups.get(group);
  if (bySession !== undefined) return { active: bySession, source: "session" };
  const byTenant = tenantGroups?.get(group);
  if (byTenant !== undefined) return { active: byTenant, source: "tenant" };
  return { active: true, source: "default" };
}

/** A tool is enabled when it has no groups or at least one of its groups is active. */
export function toolEnabled(
  def: ToolDefinition,
  tenantGroups: GroupSwitches | undefined,
  session: SessionPolicy | undefined,
): boolean {
  if (def.groups.length === 0) return true;
  return def.groups.some((group) => groupActivity(group, tenantGroups, session).active);
}

/**
 * The agent whose tools bound a call: the session's bound agent, else the one the call names.
 * Fails with `permission_denied` when both are set and differ (a session cannot leave its agent).
 */
export function effectiveAgent(
  tool: string,
  ctx: Pick<AccessContext, "session" | "agent">,
): string | undefined {
  const bound = ctx.session?.agent;
  if (bound !== undefined && ctx.agent !== undefined && ctx.agent !== bound) {
    throw new ToolmeshError(
      ErrorCode.PermissionDenied,
      `the session is bound to agent "${bound}"; it cannot call as agent "${ctx.agent}"`,
      { details: { tool, agent: ctx.agent, bound_agent: bound, reason: "other_agent" } },
    );
  }
  return bound ?? ctx.agent;
}

/**
 * Why the tool may not be called in this context, or `undefined` when it may. Checked in this
 * order:
 *
 * 1. the agent (the session's bound agent, else the call's `agent`) must list the tool —
 *    `permission_denied` (details `tool`, `agent`, `reason`: `not_in_agent_tools`,
 *    `unknown_agent` or `other_agent`). An agent no file defines is refused once any agent is
 *    configured; with no agents configured the name restricts nothing;
 * 2. at least one of the tool's groups must be active for the session (session switch, else
 *    tenant switch, else active) — `tool_disabled` (details `tool`, `groups`: each inactive
 *    group with the scope that switched it off).
 */
export function checkToolAccess(
  def: ToolDefinition,
  ctx: AccessContext,
): ToolmeshError | undefined {
  let agentName: string | undefined;
  try {
    agentName = effectiveAgent(def.name, ctx);
  } catch (err) {
    return err as ToolmeshError;
  }
  if (agentName !== undefined && ctx.agents.size > 0) {
    const agent = ctx.agents.get(agentName);
    if (agent === undefined) {
      return new ToolmeshError(
        ErrorCode.PermissionDenied,
        `unknown agent "${agentName}": no agent configuration defines it`,
        { details: { tool: def.name, agent: agentName, reason: "unknown_agent" } },
      );
    }
    if (!agent.allowed.has(def.name)) {
      return new ToolmeshError(
        ErrorCode.PermissionDenied,
        `agent "${agentName}" may not use tool "${def.name}": it is not in the agent's tool sets or tools`,
        { details: { tool: def.name, agent: agentName, reason: "not_in_agent_tools" } },
      );
    }
  }
  if (!toolEnabled(def, ctx.tenantGroups, ctx.session)) {
    const groups = def.groups.map((name) => ({
      name,
      source: groupActivity(name, ctx.tenantGroups, ctx.session).source,
    }));
    return new ToolmeshError(
      ErrorCode.ToolDisabled,
      `tool "${def.name}" is disabled: ${groups.length === 1 ? "its group" : "all its groups"} ` +
        `(${def.groups.join(", ")}) ${groups.length === 1 ? "is" : "are"} inactive for this session`,
      { details: { tool: def.name, groups } },
    );
  }
  return undefined;
}

/**
 * Every group known from the registry's tools and from the switches, as the scope sees it:
 * name, whether active, where that comes from, and the registered tools in it; sorted by name.
 */
export function describeGroups(
  tools: Iterable<ToolDefinition>,
  tenantGroups: GroupSwitches | undefined,
  session: SessionPolicy | undefined,
): GroupState[] {
  const members = new Map<string, string[]>();
  for (const def of tools) {
    for (const group of def.groups) {
      const list = members.get(group);
      if (list === undefined) members.set(group, [def.name]);
      else list.push(def.name);
    }
  }
  for (const group of [...(tenantGroups?.keys() ?? []), ...(session?.groups.keys() ?? [])]) {
    if (!members.has(group)) members.set(group, []);
  }
  return [...members.entries()]
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    .map(([name, list]) => ({
      name,
      ...groupActivity(name, tenantGroups, session),
      tools: list.sort(),
    }));
}
