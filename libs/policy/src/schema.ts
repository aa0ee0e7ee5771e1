import type { ToolDefinition } from "@toolmesh/protocol";
import type { CedarValueJson, EntityJson, EntityUidJson } from "@cedar-policy/cedar-wasm/nodejs";

// The Cedar schema every policy set is validated against (docs/policy.md#schema). Policies
// read the same everywhere: principal = the tenant, actions `call` and `list`, resource = the
// tool; what may be unknown is optional in the context, so policies test it with `has`.

/** The Cedar namespace of every toolmesh entity and action. */
export const NAMESPACE = "Toolmesh";

/** The Cedar schema of toolmesh policies, in Cedar's schema syntax. */
export const CEDAR_SCHEMA = `namespace ${NAMESPACE} {
  entity Tenant;
  type Annotations = {
    title?: String,
    readOnlyHint?: Bool,
    destructiveHint?: Bool,
    idempotentHint?: Bool,
    openWorldHint?: Bool,
  };
  entity Tool = {
    kind: String,
    groups: Set<String>,
    owner: String,
    mcp_server?: String,
    annotations: Annotations,
  };
  action call, list appliesTo {
    principal: Tenant,
    resource: Tool,
    context: {
      args: {},
      agent?: String,
      subject?: String,
      session?: String,
    },
  };
}
`;

/** The two actions a policy decides. */
export type PolicyAction = "call" | "list";

/** `Toolmesh::Tenant::"<tenant>"`. */
export function tenantUid(tenant: string): EntityUidJson {
  return { type: `${NAMESPACE}::Tenant`, id: tenant };
}

/** `Toolmesh::Action::"<action>"`. */
export function actionUid(action: PolicyAction): EntityUidJson {
  return { type: `${NAMESPACE}::Action`, id: action };
}

/** `Toolmesh::Tool::"<name>"`. */
export function toolUid(name: string): EntityUidJson {
  return { type: `${NAMESPACE}::Tool`, id: name };
}

/** The kind policies see: `native`, `http`, `openapi` or `mcp`. */
export function toolKindOf(definition: Pick<ToolDefinition, "kind" | "origin">): string {
  if (definition.kind === "mcp") return "mcp";
  const origin = definition.origin;
  if (typeof origin?.openapi === "string") return "openapi";
  if (typeof origin?.api_url === "string") return "http";
  return "native";
}

const ANNOTATION_TYPES: Record<string, "string" | "boolean"> = {
  title: "string",
  readOnlyHint: "boolean",
  destructiveHint: "boolean",
  idempotentHint: "boolean",
  openWorldHint: "boolean",
};

/** The tool as a Cedar entity: owner, groups, kind, MCP server and the known annotations. */
export function toolEntity(definition: ToolDefinition): EntityJson {
  const annotations: Record<string, CedarValueJson> = {};
  for (const [key, value] of Object.entries(definition.annotations ?? {})) {
    const expected = ANNOTATION_TYPES[key];
    if (expected !== undefined && typeof value === expected)
      annotations[key] = value as string | boolean;
  }
  const kind = toolKindOf(definition);
  const server = definition.origin?.server;
  return {
    uid: toolUid(definition.name),
    attrs: {
      kind,
      groups: [...definition.groups],
      owner: definition.owner,
      ...(kind === "mcp" && typeof server === "string" ? { mcp_server: server } : {}),
      annotations,
    },
    parents: [],
  };
}

// Keys Cedar's JSON reads as entity references or extension calls: an argument named so must
// not turn into one.
const RESERVED_KEYS = new Set(["__entity", "__extn", "__expr"]);

/**
 * A JSON value as Cedar sees it: strings, booleans, integers (64-bit), sets and records.
 * What Cedar has no value for (null, fractions, integers beyond 64 bits) is left out, so a
 * policy finds the attribute absent (`has` is false).
 */
export function cedarValue(value: unknown): CedarValueJson | undefined {
  switch (typeof value) {
    case "string":
    case "boolean":
      return value;
    case "number":
      return Number.isSafeInteger(value) ? value : undefined;
    case "object": {
      if (value === null) return undefined;
      if (Array.isArray(value)) {
        const items: CedarValueJson[] = [];
        for (const item of value) {
          const converted = cedarValue(item);
          if (converted !== undefined) items.push(converted);
        }
        return items;
      }
      const record: Record<string, CedarValueJson> = {};
      for (const [key, item] of Object.entries(value)) {
        if (RESERVED_KEYS.has(key)) continue;
        const converted = cedarValue(item);
        if (converted !== undefined) record[key] = converted;
      }
      return record;
    }
    default:
      return undefined;
  }
}
