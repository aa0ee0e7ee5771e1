import { afterEach, describe, expect, it, vi } from "vitest";
import {
  ErrorCode,
  ResolvedCallSchema,
  ToolDefinitionSchema,
  ToolmeshError,
} from "@toolmesh/protocol";
import type { CallRequest, ResolvedCall, ToolDefinition } from "@toolmesh/protocol";
import { compileTool } from "@toolmesh/registry";
import type { CompiledTool } from "@toolmesh/registry";
import {
  findCloseMatches,
  parseArguments,
  readCallIds,
  resolveCall,
  scanJsonError,
  validateToolName,
} from "./resolve-call.js";

const NOW = 1_700_000_000_000;
const ADDRESS = { tenant: "acme", session: "s-1" };

function tool(
  parameters: Record<string, unknown>,
  extra: Partial<ToolDefinition> = {},
  revision = 7,
): CompiledTool {
  return compileTool(
    ToolDefinitionSchema.parse({
      name: "t",
      summary: "a test tool",
      kind: "builtin",
      owner: "test",
      parameters,
      ...extra,
    }),
    revision,
  );
}

function request(extra: Partial<CallRequest> = {}, name = "t"): CallRequest {
  return {
    tool_call: { id: "call_1", type: "function", function: { name, arguments: "{}" } },
    session_id: "s-1",
    ...extra,
  };
}

function resolve(
  compiled: CompiledTool,
  args: Record<string, unknown>,
  extra: Partial<CallRequest> = {},
): ResolvedCall {
  return resolveCall(compiled, request(extra, compiled.definition.name), args, {
    now: NOW,
    defaultTimeoutMs: 60_000,
    address: ADDRESS,
  });
}

function thrown(fn: () => unknown): ToolmeshError {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(ToolmeshError);
    return err as ToolmeshError;
  }
  throw new Error("expected a ToolmeshError, nothing was thrown");
}

function parameterErrors(fn: () => unknown): Record<string, unknown>[] {
  const err = thrown(fn);
  expect(err.code).toBe(ErrorCode.InvalidParameters);
  return err.details?.["errors"] as Record<string, unknown>[];
}

function expectNoPollution(): void {
  expect(({} as Record<string, unknown>)["polluted"]).toBeUndefined();
  expect(Object.hasOwn(Object.prototype, "polluted")).toBe(false);
  expect(Object.getOwnPropertyNames(Object.prototype)).not.toContain("a");
}

afterEach(() => {
  vi.restoreAllMocks();
});

/** A `function_declarations` entry as a tool author wrote it, verbatim. */
const OPTIMIZE_STRUCTURE = {
  type: "object",
  required: ["input_structure", "model_path"],
  properties: {
    input_structure: { type: "string", description: "Input structure file URL or path" },
    model_path: { type: "string", description: "Path to the DPA model file" },
    head: { type: "string", description: "Model head type", default: "Omat24" },
    force_tolerance: { type: "number", description: "Force convergence tolerance", default: 0.01 },
    max_iterations: {
      type: "integer",
      description: "Maximum optimization iterations",
      default: 100,
    },
    relax_cell: {
      type: "boolean",
      description: "Whether to relax cell parameters",
      default: false,
    },
    executor: { type: "object", description: "Executor configuration" },
    storage: { type: "object", description: "Storage configuration" },
  },
};
const CIF = "https://bohrium.oss-cn-zhangjiakou.aliyuncs.com/.../Cu_bulk.cif";
const MODEL = "https://bohrium.oss-cn-zhangjiakou.aliyuncs.com/.../dpa-2.4-7M.pt";

describe("resolveCall: defaults, missing parameters, input_parameters", () => {
  it("resolves the optimize_structure example exactly", () => {
    const compiled = tool(OPTIMIZE_STRUCTURE, { name: "optimize_structure" });
    const args = parseArguments(
      JSON.stringify({ input_structure: CIF, model_path: MODEL, relax_cell: false }),
    );
    const resolved = resolve(compiled, args);

    expect(resolved.arguments).toBe(args); // filled in place, not copied
    expect(resolved.arguments).toStrictEqual({
      input_structure: CIF,
      model_path: MODEL,
      relax_cell: false,
      head: "Omat24",
      force_tolerance: 0.01,
      max_iterations: 100,
    });
    expect(resolved.missing_required).toEqual([]);
    expect(resolved.missing_optional).toEqual([]);
    expect(resolved.input_parameters).toStrictEqual([
      { name: "input_structure", type: "str", value: CIF, source: "tool_args" },
      { name: "model_path", type: "str", value: MODEL, source: "tool_args" },
      { name: "head", type: "str", value: "Omat24", source: "default" },
      { name: "force_tolerance", type: "float", value: 0.01, source: "default" },
      { name: "max_iterations", type: "int", value: 100, source: "default" },
      { name: "relax_cell", type: "bool", value: false, source: "tool_args" },
    ]);
    expect(resolved.tool).toBe("optimize_structure");
    expect(() => ResolvedCallSchema.parse(resolved)).not.toThrow();
  });

  it("builds the envelope from the request and the options", () => {
    const compiled = tool({ type: "object" }, {}, 12);
    const resolved = resolve(compiled, {});
    expect(resolved).toStrictEqual({
      call_id: "call_1",
      tool_call_id: "call_1",
      idempotency_key: "s-1/call_1",
      session_id: "s-1",
      address: { tenant: "acme", session: "s-1" },
      tool: "t",
      arguments: {},
      missing_required: [],
      missing_optional: [],
      input_parameters: [],
      context: {},
      agent_context: {},
      timeout_ms: 60_000,
      deadline_at: NOW + 60_000,
      resolved_at: NOW,
      tool_revision: 12,
    });
  });

  it("takes idempotency key, timeout, contexts and agent from the request when given", () => {
    const resolved = resolve(
      tool({ type: "object" }),
      {},
      {
        idempotency_key: "idem-9",
        timeout_ms: 5_000,
        context: { user: "u" },
        agent_context: { lang: "en" },
        agent: "planner",
      },
    );
    expect(resolved.idempotency_key).toBe("idem-9");
    expect(resolved.timeout_ms).toBe(5_000);
    expect(resolved.deadline_at).toBe(NOW + 5_000);
    expect(resolved.context).toEqual({ user: "u" });
    expect(resolved.agent_context).toEqual({ lang: "en" });
    expect(resolved.agent).toBe("planner");
    expect(() => ResolvedCallSchema.parse(resolved)).not.toThrow();
  });
});

describe("resolveCall: defaults", () => {
  const NESTED = {
    type: "object",
    properties: {
      filters: {
        type: "object",
        default: {},
        properties: {
          limit: { type: "integer", default: 10 },
          sort: {
            type: "object",
            default: {},
            properties: {
              by: { type: "string", default: "date" },
              desc: { type: "boolean", default: true },
            },
          },
          tags: { type: "array", items: { type: "string" } },
        },
      },
      weights: {
        type: "array",
        items: { type: "object", properties: { w: { type: "number", default: 1 } } },
      },
      options: { type: "object", properties: { verbose: { type: "boolean", default: false } } },
    },
  };

  it("fills an absent nested object that has a default, and the defaults inside it", () => {
    const args: Record<string, unknown> = {};
    const resolved = resolve(tool(NESTED), args);
    expect(args["filters"]).toStrictEqual({ limit: 10, sort: { by: "date", desc: true } });
    expect(resolved.input_parameters[0]).toStrictEqual({
      name: "filters",
      type: "dict",
      value: { limit: 10, sort: { by: "date", desc: true } },
      source: "default",
    });
  });

  it("fills defaults inside objects the model gave, keeping the model's values", () => {
    const args: Record<string, unknown> = {
      filters: { limit: 0, sort: { desc: false } },
      weights: [{}, { w: 0 }],
      options: {},
    };
    const resolved = resolve(tool(NESTED), args);
    expect(args).toStrictEqual({
      filters: { limit: 0, sort: { by: "date", desc: false } },
      weights: [{ w: 1 }, { w: 0 }],
      options: { verbose: false },
    });
    expect(resolved.input_parameters.map((p) => p.source)).toEqual([
      "tool_args",
      "tool_args",
      "tool_args",
    ]);
  });

  it("does not create an absent nested object that has no default; it is missing_optional", () => {
    const args: Record<string, unknown> = {};
    const resolved = resolve(tool(NESTED), args);
    expect(Object.hasOwn(args, "options")).toBe(false);
    expect(resolved.missing_optional).toEqual(["weights", "options"]);
  });

  it("gives each call its own copy of a default", () => {
    const compiled = tool(NESTED);
    const first = resolve(compiled, {});
    ((first.arguments["filters"] as Record<string, unknown>)["sort"] as Record<string, unknown>)[
      "by"
    ] = "changed";
    const second = resolve(compiled, {});
    expect(second.arguments["filters"]).toStrictEqual({
      limit: 10,
      sort: { by: "date", desc: true },
    });
    expect(compiled.properties[0]?.default).toStrictEqual({});
  });

  it.each([
    ["false", false],
    ["zero", 0],
    ["empty string", ""],
    ["null", null],
  ])("never overwrites a value the model gave: %s", (_label, value) => {
    const compiled = tool({
      type: "object",
      properties: { v: { type: ["string", "number", "boolean", "null"], default: "the default" } },
    });
    const args: Record<string, unknown> = { v: value };
    const resolved = resolve(compiled, args);
    expect(args["v"]).toBe(value);
    expect(resolved.input_parameters).toStrictEqual([
      { name: "v", type: "str", value, source: "tool_args" },
    ]);
  });

  it("treats a key whose value is undefined as absent (objects passed directly)", () => {
    const resolved = resolve(
      tool({ type: "object", properties: { n: { type: "integer", default: 3 } } }),
      { n: undefined },
    );
    expect(resolved.arguments["n"]).toBe(3);
    expect(resolved.input_parameters[0]?.source).toBe("default");
  });

  it("fills a null default but reports it as a zero value (a null default is no default)", () => {
    const resolved = resolve(
      tool({ type: "object", properties: { n: { type: ["integer", "null"], default: null } } }),
      {},
    );
    expect(resolved.arguments).toStrictEqual({ n: null });
    expect(resolved.missing_optional).toEqual([]);
    expect(resolved.input_parameters).toStrictEqual([
      { name: "n", type: "int", value: 0, source: "zero_value" },
    ]);
  });
});

describe("resolveCall: system params", () => {
  const WITH_SYSTEM = {
    type: "object",
    required: ["a", "executor"],
    additionalProperties: false,
    properties: {
      a: { type: "string" },
      executor: {
        type: "object",
        default: { kind: "local" },
        properties: { kind: { type: "string", default: "x" } },
      },
      storage: { type: "object", properties: { bucket: { type: "string" } } },
    },
  };

  it("skips them: never filled, never missing, never in input_parameters", () => {
    const resolved = resolve(tool(WITH_SYSTEM), { a: "x" });
    expect(resolved.arguments).toStrictEqual({ a: "x" });
    expect(resolved.missing_required).toEqual([]);
    expect(resolved.missing_optional).toEqual([]);
    expect(resolved.input_parameters.map((p) => p.name)).toEqual(["a"]);
  });

  it("drops a value the model gave for them before validation: the handler never sees it", () => {
    const args: Record<string, unknown> = { a: "x", executor: {}, storage: { bucket: 5 } };
    const resolved = resolve(tool(WITH_SYSTEM), args);
    expect(resolved.arguments).toStrictEqual({ a: "x" });
    expect(resolved.input_parameters.map((p) => p.name)).toEqual(["a"]);
  });

  it("shows the model a schema without them when arguments are missing", () => {
    const error = (() => {
      try {
        resolve(tool(WITH_SYSTEM), { executor: { kind: "remote" } });
      } catch (err) {
        return err as ToolmeshError;
      }
      throw new Error("expected missing_arguments");
    })();
    expect(error.code).toBe("missing_arguments");
    const parameters = error.details?.parameters as Record<string, unknown>;
    expect(Object.keys(parameters.properties as object)).toEqual(["a"]);
    expect(parameters.required).toEqual(["a"]);
  });

  it("drops additionalProperties errors for system params the schema does not declare", () => {
    const compiled = tool({
      type: "object",
      additionalProperties: false,
      properties: { a: { type: "string" } },
    });
    expect(resolve(compiled, { a: "x", executor: 1, storage: "s" }).arguments).toStrictEqual({
      a: "x",
    });
    const errors = parameterErrors(() => resolve(compiled, { a: "x", executor: 1, other: 2 }));
    expect(errors.map((e) => e["path"])).toEqual(["/other"]);
  });
});

describe("resolveCall: missing params", () => {
  const SCHEMA = {
    type: "object",
    required: ["query", "limit", "region", "lang"],
    properties: {
      query: { type: "string" },
      page: { type: "integer" },
      limit: { type: "integer", minimum: 1 },
      region: { type: "string", default: "eu" },
      lang: { type: "string" },
      safe: { type: "boolean" },
      mode: { type: "string", default: "fast" },
    },
  };

  it("separates missing_required from missing_optional, in schema order", () => {
    const err = thrown(() => resolve(tool(SCHEMA, { name: "web_search" }), { query: "q" }));
    expect(err.code).toBe(ErrorCode.MissingArguments);
    expect(err.retryable).toBe(false);
    expect(err.details).toStrictEqual({
      tool: "web_search",
      missing_required: ["limit", "lang"],
      missing_optional: ["page", "safe"],
      parameters: SCHEMA,
    });
    expect(err.message).toBe('tool "web_search" is missing required arguments: limit, lang');
  });

  it("says argument in the singular when one is missing", () => {
    const err = thrown(() => resolve(tool(SCHEMA), { query: "q", limit: 1 }));
    expect(err.message).toBe('tool "t" is missing required argument: lang');
  });

  it("reports missing arguments before invalid ones", () => {
    const err = thrown(() => resolve(tool(SCHEMA), { query: 5, limit: 0 }));
    expect(err.code).toBe(ErrorCode.MissingArguments);
    expect(err.details?.["missing_required"]).toEqual(["lang"]);
  });

  it("sends the model-facing schema, without system params in `required`", () => {
    const compiled = tool({
      type: "object",
      required: ["a", "storage"],
      properties: { a: { type: "string" }, storage: { type: "object" } },
    });
    const err = thrown(() => resolve(compiled, {}));
    expect(err.details?.["missing_required"]).toEqual(["a"]);
    expect(err.details?.["parameters"]).toBe(compiled.schema);
    expect((err.details?.["parameters"] as Record<string, unknown>)["required"]).toEqual(["a"]);
  });

  it("lists absent optional params without defaults on the resolved call", () => {
    const resolved = resolve(tool(SCHEMA), { query: "q", limit: 5, lang: "de" });
    expect(resolved.missing_required).toEqual([]);
    expect(resolved.missing_optional).toEqual(["page", "safe"]);
    expect(resolved.arguments).toStrictEqual({
      query: "q",
      limit: 5,
      lang: "de",
      region: "eu",
      mode: "fast",
    });
  });
});

describe("resolveCall: edge-connected params", () => {
  const SCHEMA = {
    type: "object",
    required: ["structure", "model"],
    properties: {
      structure: { type: "string" },
      model: { type: "string" },
      steps: { type: "integer", default: 10 },
      note: { type: "string" },
      executor: { type: "object" },
    },
  };

  it('counts them as present and gives them the value "" whatever else is known', () => {
    const args: Record<string, unknown> = {
      model: "m.pt",
      steps: "not validated: the value comes from the edge",
    };
    const resolved = resolve(tool(SCHEMA), args, {
      edge_params: ["structure", "steps", "note", "executor", "not_a_param"],
    });
    expect(resolved.missing_required).toEqual([]);
    expect(resolved.missing_optional).toEqual([]);
    expect(resolved.input_parameters).toStrictEqual([
      { name: "structure", type: "str", value: "", source: "edge" },
      { name: "model", type: "str", value: "m.pt", source: "tool_args" },
      { name: "steps", type: "int", value: "", source: "edge" },
      { name: "note", type: "str", value: "", source: "edge" },
    ]);
  });

  it("still reports a missing required param that is not edge-connected", () => {
    const err = thrown(() => resolve(tool(SCHEMA), {}, { edge_params: ["structure"] }));
    expect(err.details?.["missing_required"]).toEqual(["model"]);
  });

  it("treats an empty edge list as no edges", () => {
    const err = thrown(() => resolve(tool(SCHEMA), { model: "m" }, { edge_params: [] }));
    expect(err.details?.["missing_required"]).toEqual(["structure"]);
  });
});

describe("resolveCall: zero values", () => {
  it("gives each type its zero value, fresh for every call", () => {
    const compiled = tool({
      type: "object",
      properties: {
        s: { type: "string" },
        i: { type: "integer" },
        f: { type: "number" },
        b: { type: "boolean" },
        l: { type: "array" },
        d: { type: "object" },
      },
    });
    const first = resolve(compiled, {});
    expect(first.input_parameters).toStrictEqual([
      { name: "s", type: "str", value: "", source: "zero_value" },
      { name: "i", type: "int", value: 0, source: "zero_value" },
      { name: "f", type: "float", value: 0, source: "zero_value" },
      { name: "b", type: "bool", value: false, source: "zero_value" },
      { name: "l", type: "list", value: [], source: "zero_value" },
      { name: "d", type: "dict", value: {}, source: "zero_value" },
    ]);
    expect(first.missing_optional).toEqual(["s", "i", "f", "b", "l", "d"]);
    expect(first.arguments).toStrictEqual({});
    const second = resolve(compiled, {});
    expect(second.input_parameters[4]?.value).not.toBe(first.input_parameters[4]?.value);
    expect(second.input_parameters[5]?.value).not.toBe(first.input_parameters[5]?.value);
  });
});

describe("resolveCall: invalid_parameters", () => {
  const compiled = tool(
    {
      type: "object",
      additionalProperties: false,
      properties: {
        limit: { type: "integer", minimum: 1, maximum: 100 },
        ratio: { type: "number", exclusiveMinimum: 0 },
        mode: { enum: ["fast", "slow"] },
        email: { type: "string", format: "email" },
        when: { type: "string", format: "date-time" },
        link: { type: "string", format: "uri" },
        code: { type: "string", pattern: "^[A-Z]{3}$", minLength: 3 },
        kind: { const: "x" },
        maybe: { type: ["integer", "null"] },
        "a/b~c": { type: "integer" },
        ids: { type: "array", items: { type: "integer" }, uniqueItems: true, maxItems: 3 },
        nope: { not: {} },
        filters: {
          type: "object",
          additionalProperties: false,
          properties: {
            tags: { type: "array", items: { type: "string" } },
            range: { type: "object", required: ["from"], properties: { from: { type: "number" } } },
          },
        },
      },
    },
    { name: "search" },
  );

  it.each([
    [{ limit: "ten" }, { path: "/limit", keyword: "type", expected: "integer", received: "ten" }],
    [{ limit: 2.5 }, { path: "/limit", keyword: "type", expected: "integer", received: 2.5 }],
    [{ limit: 0 }, { path: "/limit", keyword: "minimum", expected: 1, received: 0 }],
    [{ limit: 101 }, { path: "/limit", keyword: "maximum", expected: 100, received: 101 }],
    [{ ratio: 0 }, { path: "/ratio", keyword: "exclusiveMinimum", expected: 0, received: 0 }],
    [
      { mode: "medium" },
      { path: "/mode", keyword: "enum", expected: ["fast", "slow"], received: "medium" },
    ],
    [{ email: "nope" }, { path: "/email", keyword: "format", expected: "email", received: "nope" }],
    [
      { when: "yesterday" },
      { path: "/when", keyword: "format", expected: "date-time", received: "yesterday" },
    ],
    [
      { link: "not a uri" },
      { path: "/link", keyword: "format", expected: "uri", received: "not a uri" },
    ],
    [
      { code: "ABCD" },
      { path: "/code", keyword: "pattern", expected: "^[A-Z]{3}$", received: "ABCD" },
    ],
    [{ kind: "y" }, { path: "/kind", keyword: "const", expected: "x", received: "y" }],
    [
      { maybe: "1" },
      { path: "/maybe", keyword: "type", expected: ["integer", "null"], received: "1" },
    ],
    [{ "a/b~c": "1" }, { path: "/a~1b~0c", keyword: "type", expected: "integer", received: "1" }],
    [
      { ids: [1, 2, 3, 4] },
      { path: "/ids", keyword: "maxItems", expected: 3, received: [1, 2, 3, 4] },
    ],
    [{ ids: [1, "2"] }, { path: "/ids/1", keyword: "type", expected: "integer", received: "2" }],
    [
      { ids: [1, 1] },
      { path: "/ids", keyword: "uniqueItems", expected: { i: 0, j: 1 }, received: [1, 1] },
    ],
    [{ nope: 1 }, { path: "/nope", keyword: "not", expected: undefined, received: 1 }],
    [
      { extra: 1 },
      { path: "/extra", keyword: "additionalProperties", expected: "extra", received: 1 },
    ],
    [
      { filters: { tags: ["a", 2] } },
      { path: "/filters/tags/1", keyword: "type", expected: "string", received: 2 },
    ],
    [
      { filters: { range: {} } },
      { path: "/filters/range/from", keyword: "required", expected: "from", received: undefined },
    ],
    [
      { filters: { range: { from: "0" } } },
      { path: "/filters/range/from", keyword: "type", expected: "number", received: "0" },
    ],
    [
      { filters: { x: [1] } },
      { path: "/filters/x", keyword: "additionalProperties", expected: "x", received: [1] },
    ],
  ])("reports %j", (args, expected) => {
    const errors = parameterErrors(() => resolve(compiled, args));
    expect(errors).toHaveLength(1);
    expect(errors[0]).toMatchObject(expected);
    expect(errors[0]?.["received"]).toStrictEqual(expected.received);
    expect(typeof errors[0]?.["message"]).toBe("string");
  });

  it("summarizes the first three errors in the message and counts the rest", () => {
    const err = thrown(() =>
      resolve(compiled, { limit: "ten", mode: "medium", email: "nope", kind: "y", extra: 1 }),
    );
    expect(err.code).toBe(ErrorCode.InvalidParameters);
    expect(err.retryable).toBe(false);
    expect(err.details?.["tool"]).toBe("search");
    expect((err.details?.["errors"] as unknown[]).length).toBe(5);
    expect(err.message).toBe(
      'invalid arguments for tool "search": /extra is not allowed; /limit must be integer (got string); ' +
        "/mode must be equal to one of the allowed values; and 2 more",
    );
  });

  it("words errors about the arguments object itself", () => {
    const err = thrown(() => resolve(tool({ type: "object", maxProperties: 1 }), { a: 1, b: 2 }));
    expect(err.message).toBe(
      'invalid arguments for tool "t": the arguments must NOT have more than 1 properties',
    );
    expect(err.details?.["errors"]).toStrictEqual([
      {
        path: "",
        keyword: "maxProperties",
        message: "must NOT have more than 1 properties",
        expected: 1,
        received: { a: 1, b: 2 },
      },
    ]);
  });

  it("words a type error on null", () => {
    const err = thrown(() => resolve(compiled, { limit: null }));
    expect(err.message).toBe(
      'invalid arguments for tool "search": /limit must be integer (got null)',
    );
  });

  it("reports dependentRequired at the missing property", () => {
    const errors = parameterErrors(() =>
      resolve(
        tool({
          type: "object",
          dependentRequired: { card: ["cvv"] },
          properties: { card: {}, cvv: {} },
        }),
        { card: "1" },
      ),
    );
    expect(errors).toMatchObject([
      { path: "/cvv", keyword: "dependentRequired", expected: "cvv", message: "is required" },
    ]);
  });

  it("reports unevaluatedProperties at the extra property", () => {
    const errors = parameterErrors(() =>
      resolve(tool({ type: "object", properties: { a: {} }, unevaluatedProperties: false }), {
        a: 1,
        b: 2,
      }),
    );
    expect(errors).toMatchObject([
      { path: "/b", keyword: "unevaluatedProperties", expected: "b", received: 2 },
    ]);
  });

  it("reports propertyNames with the offending name", () => {
    const errors = parameterErrors(() =>
      resolve(tool({ type: "object", propertyNames: { maxLength: 2 } }), { abc: 1 }),
    );
    expect(errors).toContainEqual(
      expect.objectContaining({ path: "", keyword: "propertyNames", expected: "abc" }),
    );
  });

  it("escapes the name of an extra or missing property in its path", () => {
    const compiled = tool({
      type: "object",
      required: ["p/q"],
      additionalProperties: false,
      properties: { "p/q": {} },
    });
    const errors = parameterErrors(() => resolve(compiled, { "p/q": 1, "x/y~z": [true] }));
    expect(errors).toMatchObject([
      { path: "/x~1y~0z", keyword: "additionalProperties", expected: "x/y~z" },
    ]);
    expect(errors[0]?.["received"]).toStrictEqual([true]);
    const nested = tool({
      type: "object",
      properties: { o: { type: "object", required: ["a~b"] } },
    });
    expect(parameterErrors(() => resolve(nested, { o: {} }))).toMatchObject([
      { path: "/o/a~0b", keyword: "required", expected: "a~b", received: undefined },
    ]);
  });

  it("reports multipleOf with the divisor", () => {
    const errors = parameterErrors(() =>
      resolve(tool({ type: "object", properties: { n: { multipleOf: 5 } } }), { n: 7 }),
    );
    expect(errors).toMatchObject([{ path: "/n", keyword: "multipleOf", expected: 5, received: 7 }]);
  });

  it("reads received through own properties only", () => {
    const errors = parameterErrors(() =>
      resolve(
        tool({
          type: "object",
          properties: {
            list: { type: "array", items: { type: "object", required: ["toString"] } },
          },
        }),
        {
          list: [{}],
        },
      ),
    );
    expect(errors).toMatchObject([{ path: "/list/0/toString", keyword: "required" }]);
    expect(errors[0]?.["received"]).toBeUndefined();
  });
});

describe("resolveCall: prototype safety", () => {
  const SCHEMA = {
    type: "object",
    properties: {
      filters: {
        type: "object",
        default: {},
        properties: {
          limit: { type: "integer", default: 10 },
          prototype: { type: "object", default: { a: 1 } },
        },
      },
    },
  };

  it("keeps __proto__ from the model as an own data property, top level and nested", () => {
    const args = parseArguments(
      '{"__proto__": {"polluted": true}, "filters": {"__proto__": {"polluted": true}, "constructor": {"prototype": {"polluted": true}}}}',
    );
    const resolved = resolve(tool(SCHEMA), args);
    expect(Object.getPrototypeOf(args)).toBe(Object.prototype);
    expect(Object.hasOwn(args, "__proto__")).toBe(true);
    const filters = resolved.arguments["filters"] as Record<string, unknown>;
    expect(Object.getPrototypeOf(filters)).toBe(Object.prototype);
    expect(Object.keys(filters)).toEqual(["__proto__", "constructor", "limit", "prototype"]);
    expect(filters["limit"]).toBe(10);
    expect(filters["prototype"]).toStrictEqual({ a: 1 });
    expect((filters as { polluted?: unknown }).polluted).toBeUndefined();
    expectNoPollution();
  });

  it("keeps constructor and prototype keys as ordinary data", () => {
    const args = parseArguments(
      '{"constructor": {"prototype": {"polluted": true}}, "prototype": {"polluted": true}}',
    );
    resolve(tool({ type: "object" }), args);
    expect(Object.keys(args)).toEqual(["constructor", "prototype"]);
    expect(args["constructor"]).toStrictEqual({ prototype: { polluted: true } });
    expectNoPollution();
  });

  it("refuses __proto__ from the model where additional properties are not allowed", () => {
    const args = parseArguments('{"__proto__": {"polluted": true}}');
    const errors = parameterErrors(() =>
      resolve(tool({ type: "object", additionalProperties: false }), args),
    );
    expect(errors).toMatchObject([
      {
        path: "/__proto__",
        keyword: "additionalProperties",
        expected: "__proto__",
        received: { polluted: true },
      },
    ]);
    expectNoPollution();
  });

  it("fills and validates params named like Object.prototype members as own properties", () => {
    const compiled = tool({
      type: "object",
      properties: {
        constructor: {
          type: "object",
          default: {},
          properties: { depth: { type: "integer", default: 2 } },
        },
        toString: { type: "string" },
        valueOf: { type: "integer", default: 1 },
      },
    });
    const args: Record<string, unknown> = {};
    const resolved = resolve(compiled, args);
    expect(Object.hasOwn(args, "constructor")).toBe(true);
    expect(args["constructor"]).toStrictEqual({ depth: 2 });
    expect(args["valueOf"]).toBe(1);
    expect(resolved.missing_optional).toEqual(["toString"]);
    expect(resolved.input_parameters).toStrictEqual([
      { name: "constructor", type: "dict", value: { depth: 2 }, source: "default" },
      { name: "toString", type: "str", value: "", source: "zero_value" },
      { name: "valueOf", type: "int", value: 1, source: "default" },
    ]);
    // the copy is the call's own: the compiled default is untouched
    expect(compiled.properties[0]?.default).toStrictEqual({});
    const given = resolve(compiled, parseArguments('{"constructor": {"depth": 0}}'));
    expect(given.input_parameters[0]).toStrictEqual({
      name: "constructor",
      type: "dict",
      value: { depth: 0 },
      source: "tool_args",
    });
    expectNoPollution();
  });

  it("works on arguments without a prototype", () => {
    const args = Object.assign(Object.create(null) as Record<string, unknown>, { x: 1 });
    const resolved = resolve(
      tool({
        type: "object",
        properties: { x: { type: "integer" }, constructor: { type: "string", default: "c" } },
      }),
      args,
    );
    expect(resolved.arguments["constructor"]).toBe("c");
    expectNoPollution();
  });
});

describe("parseArguments", () => {
  it("parses a JSON object string", () => {
    expect(parseArguments('{"a": 1, "b": [true, null]}')).toStrictEqual({ a: 1, b: [true, null] });
  });

  it.each(["", "   ", "\n\t \r\n"])("reads %j as {}", (raw) => {
    expect(parseArguments(raw)).toStrictEqual({});
  });

  it("uses an object as it is", () => {
    const args = { a: 1 };
    expect(parseArguments(args)).toBe(args);
  });

  it.each([
    ["[1, 2]", "array", "an array"],
    ['"text"', "string", "string"],
    ["null", "null", "null"],
    ["42", "number", "number"],
    ["true", "boolean", "boolean"],
  ])("refuses JSON %s that is not an object", (raw, received, wording) => {
    const err = thrown(() => parseArguments(raw));
    expect(err.code).toBe(ErrorCode.InvalidArguments);
    expect(err.details).toStrictEqual({ received });
    expect(err.message).toBe(`function.arguments must be a JSON object, got ${wording}`);
  });

  it.each([
    [[1], "array"],
    [null, "null"],
    [7, "number"],
    [undefined, "undefined"],
  ])("refuses a non-object value %j passed directly", (raw, received) => {
    const err = thrown(() => parseArguments(raw));
    expect(err.code).toBe(ErrorCode.InvalidArguments);
    expect(err.details).toStrictEqual({ received });
  });

  it("locates truncated JSON at its end", () => {
    const raw = '{"query": "cats", "limit": 1';
    const err = thrown(() => parseArguments(raw));
    expect(err.code).toBe(ErrorCode.InvalidArguments);
    expect(err.details).toMatchObject({
      position: 28,
      line: 1,
      column: 29,
      snippet: ': "cats", "limit": 1',
    });
    expect(err.message).toMatch(/^function\.arguments is not valid JSON \(line 1, column 29\): /);
    expect(err.cause).toBeInstanceOf(SyntaxError);
  });

  it("reports the end of an unfinished string as the position", () => {
    const err = thrown(() => parseArguments('{"a'));
    expect(err.details).toMatchObject({ position: 3, line: 1, column: 4, snippet: '{"a' });
  });

  it("gives line and column on multi-line input", () => {
    const err = thrown(() => parseArguments('{\n  "a": 1,\n}'));
    expect(err.details).toMatchObject({ position: 12, line: 3, column: 1 });
  });

  it("cuts the snippet around the position", () => {
    const raw = `{"text": "${"x".repeat(50)}", oops}`;
    const err = thrown(() => parseArguments(raw));
    const position = raw.indexOf("oops");
    expect(err.details).toMatchObject({
      position,
      snippet: raw.slice(position - 20, position + 20),
    });
  });

  it("locates an unexpected token V8 reports without a position", () => {
    const err = thrown(() => parseArguments('{"max": max}'));
    expect(String(err.details?.["reason"])).not.toMatch(/position/);
    expect(err.details).toMatchObject({ position: 8, line: 1, column: 9 });
  });

  it("finds the position itself, whatever an old V8 says ('… in JSON at position 12')", () => {
    vi.spyOn(JSON, "parse").mockImplementation(() => {
      throw new SyntaxError("Unexpected token } in JSON at position 12");
    });
    expect(thrown(() => parseArguments('{"a": [1, 2,}'.padEnd(13))).details).toMatchObject({
      position: 12,
      line: 1,
      column: 13,
    });
  });

  it("finds the position itself, whatever a newer V8 says ('(line 3 column 1)')", () => {
    vi.spyOn(JSON, "parse").mockImplementation(() => {
      throw new SyntaxError(
        "Expected double-quoted property name in JSON at position 12 (line 3 column 1)",
      );
    });
    expect(thrown(() => parseArguments('{\n  "a": 1,\n}')).details).toMatchObject({
      position: 12,
      line: 3,
      column: 1,
    });
  });

  it("finds the position itself when the parser names only a line and column", () => {
    vi.spyOn(JSON, "parse").mockImplementation(() => {
      throw new SyntaxError("Unexpected token (line 2 column 3)");
    });
    expect(thrown(() => parseArguments("{\n  x}")).details).toMatchObject({
      position: 4,
      line: 2,
      column: 3,
    });
    expect(thrown(() => parseArguments("{}")).details).toMatchObject({ position: 2 }); // past the end is clamped
  });

  it("ignores a position beyond the input that the parser names", () => {
    vi.spyOn(JSON, "parse").mockImplementation(() => {
      throw new SyntaxError("Unexpected token in JSON at position 99");
    });
    expect(thrown(() => parseArguments("{")).details).toMatchObject({
      position: 1,
      line: 1,
      column: 2,
    });
  });

  it("copes with something other than an Error being thrown", () => {
    vi.spyOn(JSON, "parse").mockImplementation(() => {
      // eslint-disable-next-line @typescript-eslint/only-throw-error -- simulating a hostile parser
      throw "Unexpected end of JSON input";
    });
    expect(thrown(() => parseArguments('{"a":')).details).toMatchObject({
      position: 5,
      reason: "the text ends before the JSON value does",
    });
  });

  // The fallback scanner must agree with V8 wherever V8 states a position.
  it.each([
    '{"a":1,}',
    '{"a":1} x',
    '{"a":"\u0001"}',
    "[1,2",
    "[1 2]",
    '{"a" 1}',
    "{1:2}",
    '{"a":-}',
    '{"a":1.}',
    '{"a":1e}',
    '{"a":1e+}',
    '{"a":"\\x"}',
    '{"a":"\\u12g4"}',
    '{"a": "x"',
    '"unterminated',
    '{"a":01}',
    '{"s":"a\\n\\u00e9\\"","n":-1.5e+3,"e":{},"l":[ ],"t":true,"f":false,"z":null,"x":[[{}],{"k":[]}]]}',
    "",
    "tru",
    "nul",
    "{",
    "-",
  ])("locates errors like V8 does when V8 names no position: %j", (raw) => {
    let v8Position: number | undefined;
    try {
      JSON.parse(raw);
    } catch (err) {
      const message = (err as Error).message;
      v8Position = /Unexpected end of JSON input/.test(message)
        ? raw.length
        : Number(/at position (\d+)/.exec(message)?.[1]);
    }
    expect(v8Position).toBeTypeOf("number");
    vi.spyOn(JSON, "parse").mockImplementation(() => {
      throw new SyntaxError("Unexpected token, not valid JSON");
    });
    const err = thrown(() => parseArguments(raw === "" ? " x" : raw));
    expect(err.details?.["position"]).toBe(raw === "" ? 1 : v8Position);
  });

  it.each([
    ['{"a": tru}', 9],
    ["{'a': 1}", 1],
    ['{"a": [1, 2, x]}', 13],
    ['{"n": fals}', 10],
  ])("scans %j to position %d", (raw, position) => {
    expect(thrown(() => parseArguments(raw)).details?.["position"]).toBe(position);
  });

  it.each([
    ['{"a": tru}', 'expected the literal true, found "}"'],
    ["{'a': 1}", 'expected a double-quoted property name, found "\'"'],
    ['{"a": [1, 2 3]}', "expected ',' or ']', found \"3\""],
    ['{"a": 1} x', 'text after the JSON value: "x"'],
    ['{"a": "\u0001"}', "a control character inside a string"],
    ['{"a": "\\q"}', "a bad escape in a string"],
    ['{"a": [1, 2', "the text ends before the JSON value does"],
  ])("says what is wrong with %j in its own words", (raw, reason) => {
    const err = thrown(() => parseArguments(raw));
    expect(err.details?.["reason"]).toBe(reason);
    expect(err.message).toContain(reason);
    let engine = "";
    try {
      JSON.parse(raw);
    } catch (e) {
      engine = (e as Error).message;
    }
    expect(engine).not.toBe("");
    expect(err.message).not.toContain(engine);
  });
});

describe("scanJsonError and readCallIds", () => {
  const deep = (depth: number): string => `${'{"a":'.repeat(depth)}1${"}".repeat(depth)}`;

  it("scans a broken text nested 100 000 deep without overflowing the stack", () => {
    const text = `${deep(100_000)}x`;
    expect(scanJsonError(text)).toStrictEqual({
      position: text.length - 1,
      reason: 'text after the JSON value: "x"',
    });
  });

  it("reads the call id, tool and session id before the damage", () => {
    const text =
      '{"session_id":"s-1","tool_call":{"id":"call-7","type":"function",' +
      '"function":{"name":"echo","arguments":{"x":[1,2,,]}}}}';
    expect(readCallIds(text)).toStrictEqual({
      sessionId: "s-1",
      toolCallId: "call-7",
      tool: "echo",
    });
  });

  it("reads escaped ids, and nothing from elsewhere in the body", () => {
    const text =
      '{"context":{"id":"not-this","tool_call":{"id":"nor-this"}},' +
      '"tool_call":{"id":"c\\u002d\\"1\\"","function":{"arguments":"{}"}},"x":';
    expect(readCallIds(text)).toStrictEqual({ toolCallId: 'c-"1"' });
  });

  it("reads nothing from ids after the damage, empty ones or ones over 256 characters", () => {
    expect(readCallIds('{"tool_call": {"id": x, "function": {"name": "echo"}}}')).toStrictEqual({});
    expect(readCallIds(`{"tool_call":{"id":"${"i".repeat(257)}"},`)).toStrictEqual({});
    expect(readCallIds('{"tool_call":{"id":""},')).toStrictEqual({});
  });

  it("does not overflow the stack on deeply nested bad input", () => {
    const raw = `${"[".repeat(100_000)}x`;
    expect(thrown(() => parseArguments(raw)).details?.["position"]).toBe(100_000);
  });
});

describe("findCloseMatches", () => {
  const TOOLS = [
    "search_web",
    "search_news",
    "get_weather",
    "send_email",
    "web_search",
    "read_file",
  ];

  it("finds a misspelling first", () => {
    expect(findCloseMatches("serch_web", TOOLS)[0]).toBe("search_web");
  });

  it("ignores case", () => {
    expect(findCloseMatches("SEARCH_WEB", TOOLS)[0]).toBe("search_web");
    expect(findCloseMatches("search_web", ["Search_Web"])).toEqual(["Search_Web"]);
  });

  it("counts an adjacent swap as one edit", () => {
    // "saerch_web" is one swap from "search_web" but two plain edits; "search_wub" is one substitution.
    expect(findCloseMatches("saerch_web", ["search_wxx", "search_web"])).toEqual([
      "search_web",
      "search_wxx",
    ]);
  });

  it("finds names that contain the query or are contained in it", () => {
    expect(findCloseMatches("weather", TOOLS)).toEqual(["get_weather"]);
    expect(findCloseMatches("read_file_contents", TOOLS)).toEqual(["read_file"]);
  });

  it("orders by distance, then by name", () => {
    expect(findCloseMatches("search", TOOLS)).toEqual(["search_web", "web_search", "search_news"]);
    expect(findCloseMatches("cat", ["hat", "cab", "bat", "dog"])).toEqual(["bat", "cab", "hat"]);
  });

  it("returns at most `max`", () => {
    expect(findCloseMatches("search", TOOLS, 1)).toEqual(["search_web"]);
    expect(findCloseMatches("search", TOOLS, 0)).toEqual([]);
    expect(findCloseMatches("search", TOOLS, 10)).toHaveLength(3);
  });

  it("returns nothing when nothing is close", () => {
    expect(findCloseMatches("zzzzzz", TOOLS)).toEqual([]);
    expect(findCloseMatches("ab", ["abc_tool"])).toEqual([]);
    expect(findCloseMatches("x", [])).toEqual([]);
  });

  it("takes any iterable and lists a name once", () => {
    function* names(): Generator<string> {
      yield "get_weather";
      yield "get_weather";
      yield "get_whether";
    }
    expect(findCloseMatches("get_weathr", names())).toEqual(["get_weather", "get_whether"]);
    expect(findCloseMatches("get_weathr", new Set(TOOLS))).toEqual(["get_weather"]);
  });
});

describe("validateToolName", () => {
  it.each([
    "a",
    "x".repeat(128),
    "a.b",
    "a*b",
    "a>b",
    "a b",
    "工具",
    "名".repeat(128),
    "tool\u0080",
  ])("accepts %j", (name) => {
    expect(() => validateToolName(name)).not.toThrow();
  });

  it.each([
    ["x".repeat(129), { length: 129, max_length: 128 }],
    ["", { length: 0 }],
    ["a\u0000b", { position: 1, code_point: 0 }],
    ["a\nb", { position: 1, code_point: 10 }],
    ["\u001f", { position: 0, code_point: 31 }],
    ["del\u007f", { position: 3, code_point: 127 }],
  ])("refuses %j", (name, details) => {
    const err = thrown(() => validateToolName(name));
    expect(err.code).toBe(ErrorCode.InvalidRequest);
    expect(err.details).toStrictEqual(details);
  });

  it("shows only the start of a long name", () => {
    const err = thrown(() => validateToolName("y".repeat(1000)));
    expect(err.message).toContain(`"${"y".repeat(64)}…"`);
    expect(err.message.length).toBeLessThan(200);
  });
});
