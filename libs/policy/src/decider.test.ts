import { describe, expect, it } from "vitest";
import type { ToolDefinition } from "@toolmesh/protocol";
import { ErrorCode } from "@toolmesh/protocol";
import { CompiledPolicySet, PolicySetError } from "./policy-set.js";
import { PolicyDecider } from "./decider.js";
import { actionUid, cedarValue, tenantUid, toolEntity, toolUid } from "./schema.js";

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

describe("PolicyDecider.decideCallSoon", () => {
  const SET = `@id("all") permit(principal, action, resource);
@id("no-secrets") forbid(principal, action, resource == Toolmesh::Tool::"write_file") when { context.args has text && context.args.text like "*password*" };`;
  const call = (text: string) => ({
    address: { tenant: "acme", session: "s" },
    arguments: { text },
  });

  it("decides the calls of one turn together, each as decideCall does", async () => {
    const d = decider(SET);
    const texts = ["hello", "my password", "x".repeat(64), "password", "fine"];
    const soon = await Promise.all(texts.map((t) => d.decideCallSoon(call(t), WRITE)));
    expect(soon).toEqual(texts.map((t) => d.decideCall(call(t), WRITE)));
    expect(soon.map((decision) => decision?.allowed)).toEqual([true, false, true, false, true]);
    expect(soon[1]?.policies).toEqual(["operator:no-secrets"]);
  });

  it("answers at once what it knows without the arguments, and nothing with no set", async () => {
    const d = decider(SET);
    let turnEnded = false;
    setImmediate(() => (turnEnded = true));
    const known = await d.decideCallSoon(call("my password"), READ);
    const unknownTool = await d.decideCallSoon(call("hello"), undefined);
    expect(turnEnded).toBe(false);
    expect(known).toMatchObject({ allowed: true, policies: ["operator:all"] });
    expect(unknownTool?.allowed).toBe(false);
    expect(await decider().decideCallSoon(call("hello"), WRITE)).toBeUndefined();
  });
});

describe("PolicyDecider: what partial evaluation leaves decides as the whole set does", () => {
  // Every call decision is made from a residual (the policies still undecided with arguments
  // and session unknown) and the permits already known satisfied; each must equal Cedar's
  // answer from the whole set with everything known.
  const SETS = [
    // Known permits beside a forbid that reads the arguments.
    `@id("read-only") permit(principal, action, resource) when { resource.annotations has readOnlyHint && resource.annotations.readOnlyHint };\n@id("native") permit(principal, action, resource) when { resource.kind == "native" };\n@id("no-secrets") forbid(principal, action, resource) when { context.args has text && context.args.text like "*password*" };`,
    // A permit that reads the arguments beside a known one; a forbid that can fail to evaluate.
    `@id("native") permit(principal, action, resource) when { resource.kind == "native" };\n@id("small") permit(principal, action, resource) when { context.args has n && context.args.n < 10 };\n@id("not-big") forbid(principal, action, resource) when { context.args has n && context.args.n > 100 };`,
    // Only permits that read arguments and the resource together, and an unless.
    `@id("svc-text") permit(principal, action, resource) when { resource.owner == "svc" && context.args has text } unless { context.args has n };\n@id("tmp") forbid(principal, action, resource) unless { context has session && context.session like "s-*" };`,
    // Attributes of the resource and principal read only after an unknown.
    `@id("then-owner") permit(principal, action, resource) when { context.args has text && resource.owner == "svc" && resource.groups.contains("default") };\n@id("then-fs") forbid(principal, action, resource) when { context.args has n && resource.groups.contains("fs") };`,
    // Permits satisfied whatever the arguments are, no forbid.
    `@id("a") permit(principal, action, resource);\n@id("b") permit(principal == Toolmesh::Tenant::"acme", action, resource) when { resource.groups.contains("fs") };`,
  ];
  const ARGS: Record<string, unknown>[] = [
    {},
    { text: "hello" },
    { text: "my password" },
    { n: 5 },
    { n: 50 },
    { n: 500 },
    { n: "5" },
    { text: "x", n: 1 },
  ];
  const TOOLS = [READ, WRITE, tool("remote", { kind: "mcp", owner: "other" })];

  it.each(SETS.map((text, i) => [i, text]))("set %i", (_i, text) => {
    const set = CompiledPolicySet.compile(text);
    const d = new PolicyDecider();
    d.setOperator({ set, revision: 1 });
    let compared = 0;
    for (const definition of TOOLS)
      for (const tenant of ["acme", "globex"])
        for (const session of ["s-1", "x-1"])
          for (const args of ARGS) {
            // Twice: the first computes the residual, the second reads it from memory.
            for (let round = 0; round < 2; round++) {
              const got = d.decideCall(
                { address: { tenant, session }, arguments: args },
                definition,
              );
              const whole = set.authorize({
                principal: tenantUid(tenant),
                action: actionUid("call"),
                resource: toolUid(definition.name),
                context: { args: cedarValue(args) ?? {}, session },
                entities: [toolEntity(definition)],
              });
              const where = `${definition.name} ${tenant} ${session} ${JSON.stringify(args)}`;
              const named = [...whole.policies].sort().map((id) => `operator:${id}`);
              expect(got?.allowed, where).toBe(whole.decision === "allow");
              // An allow names its permits as Cedar does (in any order); a deny names the forbids that matched,
              // or none when no permit could apply whatever the arguments (decided before them).
              const policies = [...(got?.policies ?? [])].sort();
              if (got?.allowed === true || policies.length > 0)
                expect(policies, where).toEqual(named);
              compared++;
            }
          }
    expect(compared).toBe(TOOLS.length * 2 * 2 * ARGS.length * 2);
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
