import { describe, expect, it } from "vitest";
import type { ToolDefinition, ToolDefinitionInput } from "@toolmesh/protocol";
import { ErrorCode, ToolDefinitionSchema, ToolmeshError } from "@toolmesh/protocol";
import { buildCatalog } from "./catalog.js";
import { buildCatalogConfig } from "./config.js";
import {
  checkToolAccess,
  describeGroups,
  effectiveAgent,
  groupActivity,
  toolEnabled,
} from "./policy.js";
import type { SessionPolicy } from "./policy.js";
import {
  MAX_SUMMARY_LENGTH,
  compactCatalogEntry,
  compactLine,
  expandedCatalogEntry,
  modelSchema,
} from "./schema.js";
import type { RevisedTool } from "./schema.js";

function def(input: Partial<ToolDefinitionInput> & { name: string }): ToolDefinition {
  return ToolDefinitionSchema.parse({
    summary: "",
    parameters: { type: "object", properties: {} },
    kind: "builtin",
    owner: "test",
    ...input,
  });
}

const tool = (
  input: Partial<ToolDefinitionInput> & { name: string },
  revision = 1,
): RevisedTool => ({
  definition: def(input),
  revision,
});

const weather = tool(
  {
    name: "get_weather",
    description: "Forecast for a city. Answers in the caller's units.",
    groups: ["web"],
    parameters: {
      type: "object",
      properties: {
        city: { type: "string" },
        days: { type: "integer", default: 3 },
        executor: { type: "string" },
      },
      required: ["city", "executor"],
    },
    preset_params: ["api_key"],
  },
  7,
);
const echo = tool({ name: "echo", summary: "Says it back.", description: "Returns its text." });
const admin = tool({
  name: "reset_db",
  description: "Drops everything.",
  groups: ["admin", "ops"],
});
const tools = [weather, echo, admin];

const config = buildCatalogConfig({
  toolSets: [
    { file: "tool_sets/basic.yaml", data: { name: "basic", tools: ["get_weather", "echo"] } },
  ],
  agents: [
    {
      file: "agents/helper.yaml",
      data: {
        name: "helper",
        tool_sets: ["basic"],
        tools: ["missing_tool"],
        output_strategy: { function_calling: false },
      },
    },
    { file: "agents/ops.yaml", data: { name: "ops", tools: ["reset_db", "echo"] } },
  ],
});
const agents = config.agents;

const policy = (groups: Record<string, boolean> = {}, agent?: string): SessionPolicy => ({
  groups: new Map(Object.entries(groups)),
  agent,
});

function expectError(
  err: ToolmeshError | undefined,
  code: ErrorCode,
  details: Record<string, unknown>,
): void {
  expect(err).toBeInstanceOf(ToolmeshError);
  expect(err?.code).toBe(code);
  expect(err?.retryable).toBe(false);
  expect(err?.details).toEqual(details);
}

describe("compactLine", () => {
  it("uses the configured summary, else the description's first sentence", () => {
    expect(compactLine(echo.definition)).toBe("Says it back.");
    expect(compactLine(weather.definition)).toBe("Forecast for a city.");
  });

  it("collapses whitespace and bounds the length", () => {
    const long = def({ name: "x", description: `${"word ".repeat(100)}end.` });
    const line = compactLine(long);
    expect(line.length).toBeLessThanOrEqual(MAX_SUMMARY_LENGTH);
    expect(line.endsWith("…")).toBe(true);
    expect(compactLine(def({ name: "y", summary: "two\n  lines\there" }))).toBe("two lines here");
  });
});

describe("modelSchema", () => {
  it("drops system and preset params from properties and required, not from the definition", () => {
    const schema = modelSchema(weather);
    expect(schema).toEqual({
      tool: "get_weather",
      revision: 7,
      summary: "Forecast for a city.",
      description: "Forecast for a city. Answers in the caller's units.",
      parameters: {
        type: "object",
        properties: { city: { type: "string" }, days: { type: "integer", default: 3 } },
        required: ["city"],
      },
      required: ["city"],
      groups: ["web"],
      progress: false,
    });
    expect(Object.keys(weather.definition.parameters.properties as object)).toContain("executor");
  });

  it("copes with a schema without properties or required", () => {
    expect(modelSchema(tool({ name: "t", parameters: { type: "object" } })).required).toEqual([]);
  });
});

describe("catalog entries", () => {
  it("compact entries carry no schema; expanded ones the model-facing schema", () => {
    expect(compactCatalogEntry(weather)).toEqual({
      name: "get_weather",
      summary: "Forecast for a city.",
      groups: ["web"],
      revision: 7,
      progress: false,
    });
    const expanded = expandedCatalogEntry(weather);
    expect(expanded.parameters).toEqual(modelSchema(weather).parameters);
    expect(expanded.description).toBe(weather.definition.description);
  });
});

describe("groups", () => {
  it("a session switch wins over the tenant's, which wins over the default (active)", () => {
    const tenant = new Map([
      ["web", false],
      ["ops", false],
    ]);
    expect(groupActivity("web", tenant, policy({ web: true }))).toEqual({
      active: true,
      source: "session",
    });
    expect(groupActivity("web", tenant, policy())).toEqual({ active: false, source: "tenant" });
    expect(groupActivity("other", tenant, undefined)).toEqual({ active: true, source: "default" });
  });

  it("a tool is enabled while any of its groups is active, or when it has none", () => {
    expect(toolEnabled(admin.definition, new Map([["admin", false]]), undefined)).toBe(true);
    expect(toolEnabled(admin.definition, new Map([["admin", false]]), policy({ ops: false }))).toBe(
      false,
    );
    expect(
      toolEnabled(def({ name: "free", groups: [] }), new Map([["default", false]]), undefined),
    ).toBe(true);
  });

  it("describes every group of the registry and the switches, sorted", () => {
    const states = describeGroups(
      tools.map((t) => t.definition),
      new Map([["legacy", false]]),
      policy({ web: false }),
    );
    expect(states).toEqual([
      { name: "admin", active: true, source: "default", tools: ["reset_db"] },
      { name: "default", active: true, source: "default", tools: ["echo"] },
      { name: "legacy", active: false, source: "tenant", tools: [] },
      { name: "ops", active: true, source: "default", tools: ["reset_db"] },
      { name: "web", active: false, source: "session", tools: ["get_weather"] },
    ]);
  });
});

describe("checkToolAccess", () => {
  it("lets anything through without switches or agents", () => {
    for (const t of tools) expect(checkToolAccess(t.definition, { agents })).toBeUndefined();
    expect(
      checkToolAccess(weather.definition, { agents: new Map(), agent: "whoever" }),
    ).toBeUndefined();
  });

  it("answers tool_disabled naming each inactive group and who switched it off", () => {
    expectError(
      checkToolAccess(admin.definition, {
        agents,
        tenantGroups: new Map([["admin", false]]),
        session: policy({ ops: false }),
      }),
      ErrorCode.ToolDisabled,
      {
        tool: "reset_db",
        groups: [
          { name: "admin", source: "tenant" },
          { name: "ops", source: "session" },
        ],
      },
    );
  });

  it("allows an agent only its merged tools", () => {
    expect(checkToolAccess(weather.definition, { agents, agent: "helper" })).toBeUndefined();
    expectError(
      checkToolAccess(admin.definition, { agents, agent: "helper" }),
      ErrorCode.PermissionDenied,
      { tool: "reset_db", agent: "helper", reason: "not_in_agent_tools" },
    );
  });

  it("refuses an unknown agent once agents are configured", () => {
    expectError(
      checkToolAccess(echo.definition, { agents, agent: "nobody" }),
      ErrorCode.PermissionDenied,
      { tool: "echo", agent: "nobody", reason: "unknown_agent" },
    );
  });

  it("holds a bound session to its agent, whatever the call names", () => {
    const bound = policy({}, "ops");
    expect(checkToolAccess(admin.definition, { agents, session: bound })).toBeUndefined();
    expectError(
      checkToolAccess(weather.definition, { agents, session: bound }),
      ErrorCode.PermissionDenied,
      { tool: "get_weather", agent: "ops", reason: "not_in_agent_tools" },
    );
    expectError(
      checkToolAccess(echo.definition, { agents, session: bound, agent: "helper" }),
      ErrorCode.PermissionDenied,
      { tool: "echo", agent: "helper", bound_agent: "ops", reason: "other_agent" },
    );
    expect(effectiveAgent("echo", { session: bound, agent: "ops" })).toBe("ops");
  });

  it("checks the agent before the groups", () => {
    const err = checkToolAccess(admin.definition, {
      agents,
      agent: "helper",
      tenantGroups: new Map([
        ["admin", false],
        ["ops", false],
      ]),
    });
    expect(err?.code).toBe(ErrorCode.PermissionDenied);
  });
});

describe("buildCatalog", () => {
  it("lists every enabled tool by name, compact", () => {
    const built = buildCatalog({ tools, agents, tenantGroups: new Map([["web", false]]) });
    expect(built.tools.map((t) => t.name)).toEqual(["echo", "reset_db"]);
    expect(built.tools.every((t) => t.parameters === undefined)).toBe(true);
    expect(built).toMatchObject({ agent: undefined, unavailable: [], outputStrategy: undefined });
  });

  it("with an agent: its tools in its order, the unregistered ones reported, its strategy", () => {
    const built = buildCatalog({ tools, agents, agent: "helper" });
    expect(built.tools.map((t) => t.name)).toEqual(["get_weather", "echo"]);
    expect(built.unavailable).toEqual(["missing_tool"]);
    expect(built.outputStrategy).toEqual({
      function_calling: false,
      fallback_to_structured_output: true,
    });
  });

  it("uses the session's bound agent and its group switches", () => {
    const built = buildCatalog({ tools, agents, session: policy({ default: false }, "helper") });
    expect(built.agent).toBe("helper");
    expect(built.tools.map((t) => t.name)).toEqual(["get_weather"]);
  });

  it("gives tools the session has seen expanded", () => {
    const built = buildCatalog({ tools, agents, expanded: new Set(["get_weather"]) });
    const entry = built.tools.find((t) => t.name === "get_weather");
    expect(entry?.parameters).toEqual(modelSchema(weather).parameters);
    expect(built.tools.find((t) => t.name === "echo")?.parameters).toBeUndefined();
  });

  it("refuses an unknown agent, or another agent than the bound one", () => {
    expect(() => buildCatalog({ tools, agents, agent: "nobody" })).toThrow(
      /unknown agent "nobody"/,
    );
    expect(() =>
      buildCatalog({ tools, agents, agent: "ops", session: policy({}, "helper") }),
    ).toThrow(/bound to agent "helper"/);
  });

  it("treats an agent name as a label when no agent is configured", () => {
    const built = buildCatalog({ tools, agents: new Map(), agent: "anyone" });
    expect(built.tools).toHaveLength(3);
  });
});
