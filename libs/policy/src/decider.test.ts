import { describe, expect, it } from "vitest";
import type { ToolDefinition } from "@toolmesh/protocol";
import { ErrorCode } from "@toolmesh/protocol";
import { CompiledPolicySet, PolicySetError } from "./policy-set.js";
import { PolicyDecider } from "./decider.js";
import { cedarValue, toolEntity } from "./schema.js";

function tool(name: string, extra: Partial<ToolDefinition> = {}): ToolDefinition {
  return {
    name,
    description: "",
    summary: name,
    parameters: { type: "object" },
    groups: ["default"],
    system_params: [],
    preset_params: [],
    kind: "native",
    progress: false,
    owner: "svc",
    timeout_ms: 1_000,
    retry: {
      max_attempts: 1,
      initial_backoff_ms: 1,
      backoff_multiplier: 1,
      max_backoff_ms: 1,
      non_retryable_codes: [],
    },
    ...extra,
  };
}

function decider(operator?: string, tenants: Record<string, string> = {}): PolicyDecider {
  const d = new PolicyDecider();
  if (operator !== undefined)
    d.setOperator({ set: CompiledPolicySet.compile(operator), revision: 1 });
  for (const [tenant, text] of Object.entries(tenants))
    d.setTenant(tenant, { set: CompiledPolicySet.compile(text), revision: 2 });
  return d;
}

const READ = tool("read_file", { annotations: { readOnlyHint: true } });
const WRITE = tool("write_file", { annotations: { destructiveHint: true }, groups: ["fs"] });

describe("CompiledPolicySet.compile", () => {
  it("refuses a syntax error with its line and column", () => {
    const text = `permit(principal, action, resource);\npermit(principal, action resource);\n`;
    const err = (() => {
      try {
        CompiledPolicySet.compile(text);
      } catch (e) {
        return e;
      }
      return undefined;
    })();
    expect(err).toBeInstanceOf(PolicySetError);
    const problem = (err as PolicySetError).problems[0];
    expect(problem).toMatchObject({ line: 2, column: 26 });
    expect((err as PolicySetError).code).toBe(ErrorCode.InvalidRequest);
  });

  it("refuses a policy that does not match the schema, naming where", () => {
    const text = `@id("ok")\npermit(principal, action, resource);\n@id("typo")\npermit(principal, action, resource)\n  when { resource.kinds == "mcp" };`;
    expect(() => CompiledPolicySet.compile(text)).toThrow(/line 5, column \d+: policy "typo"/);
  });

  it("refuses an unknown action and a duplicate id", () => {
    expect(() =>
      CompiledPolicySet.compile(`permit(principal, action == Toolmesh::Action::"run", resource);`),
    ).toThrow(PolicySetError);
    expect(() =>
      CompiledPolicySet.compile(
        `@id("a") permit(principal, action, resource);\n@id("a") forbid(principal, action, resource);`,
      ),
    ).toThrow(/line 2, column 1: policy id "a" is used twice/);
  });

  it("names policies by @id, else by place", () => {
    const set = CompiledPolicySet.compile(
      `permit(principal, action, resource);\n@id("x") forbid(principal, action, resource);`,
    );
    expect(set.ids).toEqual(["policy0", "x"]);
  });
});

describe("PolicyDecider", () => {
  it("decides nothing with no set in force", () => {
    const d = decider();
    expect(d.active).toBe(false);
    expect(d.decide("call", { tenant: "acme", tool: READ, args: {} })).toBeUndefined();
    expect(d.mayList({ tenant: "acme", tool: WRITE })).toBe(true);
  });

  it("allows what a policy permits and names it; refuses the rest with no policy named", () => {
    const d = decider(
      `@id("read-only") permit(principal, action, resource) when { resource.annotations has readOnlyHint && resource.annotations.readOnlyHint };`,
    );
    expect(d.decide("call", { tenant: "acme", tool: READ, args: {} })).toEqual({
      allowed: true,
      policies: ["operator:read-only"],
      version: "operator@1",
    });
    const refused = d.decide("call", { tenant: "acme", tool: WRITE, args: {} });
    expect(refused).toEqual({ allowed: false, policies: [], version: "operator@1" });
    const error = PolicyDecider.refusal(refused!, "write_file");
    expect(error.code).toBe(ErrorCode.PermissionDenied);
    expect(error.message).not.toContain("readOnlyHint");
  });

  it("decides on arguments, and a forbid that cannot be evaluated refuses", () => {
    const d = decider(
      `@id("all") permit(principal, action, resource);\n@id("no-etc") forbid(principal, action == Toolmesh::Action::"call", resource) when { context.args has path && context.args.path like "/etc/*" };\n@id("small") forbid(principal, action, resource) when { context.args has n && context.args.n > 5 };`,
    );
    const call = (args: Record<string, unknown>) =>
      d.decide("call", { tenant: "t", tool: WRITE, args });
    expect(call({ path: "/tmp/a" })?.allowed).toBe(true);
    expect(call({ path: "/etc/passwd" })).toMatchObject({
      allowed: false,
      policies: ["operator:no-etc"],
    });
    expect(call({ n: 3 })?.allowed).toBe(true);
    expect(call({ n: "three" })).toMatchObject({ allowed: false, policies: ["operator:small"] });
    expect(d.mayList({ tenant: "t", tool: WRITE })).toBe(true);
  });

  it("lets a tenant's set narrow the operator's, never widen it", () => {
    const d = decider(
      `@id("read") permit(principal, action, resource) when { resource.annotations has readOnlyHint };`,
      {
        acme: `@id("everything") permit(principal, action, resource);\n@id("no-read") forbid(principal == Toolmesh::Tenant::"acme", action, resource) when { resource == Toolmesh::Tool::"x" };`,
      },
    );
    expect(d.decide("call", { tenant: "acme", tool: WRITE, args: {} })).toMatchObject({
      allowed: false,
      policies: [],
    });
    expect(d.decide("call", { tenant: "acme", tool: READ, args: {} })).toEqual({
      allowed: true,
      policies: ["operator:read", "tenant:everything"],
      version: "operator@1,tenant@2",
    });
    expect(d.decide("call", { tenant: "other", tool: READ, args: {} })?.version).toBe("operator@1");
  });

  it("sees agent, subject and session only when known", () => {
    const d = decider(
      `@id("agent") permit(principal, action, resource) when { context has agent && context.agent == "reader" };\n@id("session") forbid(principal, action, resource) when { context has session && context.session == "s-bad" };`,
    );
    expect(
      d.decide("call", { tenant: "t", tool: READ, args: {}, agent: "reader", session: "s1" })
        ?.allowed,
    ).toBe(true);
    expect(
      d.decide("call", { tenant: "t", tool: READ, args: {}, agent: "reader", session: "s-bad" }),
    ).toMatchObject({
      allowed: false,
      policies: ["operator:session"],
    });
    expect(d.decide("call", { tenant: "t", tool: READ, args: {} })?.allowed).toBe(false);
    expect(d.mayList({ tenant: "t", tool: READ })).toBe(false);
    expect(d.mayList({ tenant: "t", tool: READ, agent: "reader" })).toBe(true);
  });
});

describe("PolicyDecider.decideCall", () => {
  it("gives a call's verified identity subject to policies as context.subject", () => {
    const d = decider(
      `@id("alice-only") permit(principal, action, resource) when { context has subject && context.subject == "alice" };`,
    );
    const call = { address: { tenant: "acme", session: "s" }, arguments: {} };
    const asAlice = d.decideCall({ ...call, identity: { subject: "alice" } }, READ);
    expect(asAlice).toMatchObject({ allowed: true, policies: ["operator:alice-only"] });
    expect(d.decideCall({ ...call, identity: { subject: "bob" } }, READ)?.allowed).toBe(false);
    expect(d.decideCall(call, READ)?.allowed).toBe(false);
  });
});

describe("cedarValue and toolEntity", () => {
  it("never lets an argument become an entity reference or extension call", () => {
    expect(
      cedarValue({
        __entity: { type: "Toolmesh::Tenant", id: "x" },
        a: [1, null, 1.5, "s"],
        b: null,
      }),
    ).toEqual({
      a: [1, "s"],
    });
  });

  it("gives policies kind, groups, owner, MCP server and annotations", () => {
    const mcp = tool("gh.issues", {
      kind: "mcp",
      origin: { server: "gh" },
      annotations: { readOnlyHint: true, x: 1 },
    });
    expect(toolEntity(mcp).attrs).toEqual({
      kind: "mcp",
      groups: ["default"],
      owner: "svc",
      mcp_server: "gh",
      annotations: { readOnlyHint: true },
    });
    expect(toolEntity(tool("o", { origin: { openapi: "spec.yaml" } })).attrs.kind).toBe("openapi");
    expect(toolEntity(tool("h", { origin: { api_url: "http://x" } })).attrs.kind).toBe("http");
  });
});
