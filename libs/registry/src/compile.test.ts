import { describe, expect, it } from "vitest";
import { ErrorCode, ToolDefinitionSchema, ToolmeshError } from "@toolmesh/protocol";
import type { ToolDefinition } from "@toolmesh/protocol";
import { compileTool, getSharedAjv, paramTypeOf } from "./compile.js";

function definition(
  parameters: Record<string, unknown>,
  extra: Partial<ToolDefinition> = {},
): ToolDefinition {
  return ToolDefinitionSchema.parse({
    name: "t",
    summary: "a test tool",
    kind: "builtin",
    owner: "test",
    parameters,
    ...extra,
  });
}

/** The seed 000 example, `optimize_structure`, with `executor` made required to prove it is dropped. */
const OPTIMIZE_STRUCTURE = {
  type: "object",
  required: ["input_structure", "model_path", "executor"],
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
    executor: { type: "object", description: "Executor configuration", default: { kind: "local" } },
    storage: { type: "object", description: "Storage configuration" },
  },
};

function thrown(fn: () => unknown): ToolmeshError {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(ToolmeshError);
    return err as ToolmeshError;
  }
  throw new Error("expected a ToolmeshError, nothing was thrown");
}

describe("compileTool", () => {
  it("describes every top-level property in schema order, flagging system params", () => {
    const tool = compileTool(definition(OPTIMIZE_STRUCTURE, { name: "optimize_structure" }), 42);
    expect(tool.revision).toBe(42);
    expect(tool.definition.name).toBe("optimize_structure");
    expect([...tool.systemParams]).toEqual(["executor", "storage"]);
    expect(
      tool.properties.map((p) => [p.name, p.type, p.required, p.hasDefault, p.default, p.system]),
    ).toEqual([
      ["input_structure", "str", true, false, undefined, false],
      ["model_path", "str", true, false, undefined, false],
      ["head", "str", false, true, "Omat24", false],
      ["force_tolerance", "float", false, true, 0.01, false],
      ["max_iterations", "int", false, true, 100, false],
      ["relax_cell", "bool", false, true, false, false],
      ["executor", "dict", false, true, { kind: "local" }, true],
      ["storage", "dict", false, false, undefined, true],
    ]);
    expect(tool.properties[0]?.schema).toBe(OPTIMIZE_STRUCTURE.properties.input_structure);
  });

  it("removes system params from `required` in the model-facing schema without touching the definition", () => {
    const def = definition(OPTIMIZE_STRUCTURE);
    const tool = compileTool(def, 1);
    expect(tool.schema["required"]).toEqual(["input_structure", "model_path"]);
    expect(tool.schema["properties"]).toBe(def.parameters["properties"]);
    expect(def.parameters["required"]).toEqual(["input_structure", "model_path", "executor"]);
  });

  it("keeps the definition's schema object when no system param is required", () => {
    const def = definition({
      type: "object",
      required: ["a"],
      properties: { a: { type: "string" } },
    });
    expect(compileTool(def, 1).schema).toBe(def.parameters);
  });

  it("uses the tool's own system params", () => {
    const def = definition(
      {
        type: "object",
        required: ["a", "session"],
        properties: { a: { type: "string" }, session: { type: "string" } },
      },
      { system_params: ["session"] },
    );
    const tool = compileTool(def, 1);
    expect([...tool.systemParams]).toEqual(["session"]);
    expect(tool.properties.map((p) => [p.name, p.required, p.system])).toEqual([
      ["a", true, false],
      ["session", false, true],
    ]);
    expect(tool.validate({ a: "x" })).toBe(true);
  });

  it("fills defaults in place and never validates or fills system params", () => {
    const tool = compileTool(definition(OPTIMIZE_STRUCTURE), 1);
    const args: Record<string, unknown> = {
      input_structure: "s.cif",
      model_path: "m.pt",
      storage: "not an object",
    };
    expect(tool.validate(args)).toBe(true);
    expect(args).toEqual({
      input_structure: "s.cif",
      model_path: "m.pt",
      storage: "not an object",
      head: "Omat24",
      force_tolerance: 0.01,
      max_iterations: 100,
      relax_cell: false,
    });
    expect(Object.hasOwn(args, "executor")).toBe(false);
  });

  it("validates the model's params", () => {
    const tool = compileTool(definition(OPTIMIZE_STRUCTURE), 1);
    expect(tool.validate({ input_structure: "s", model_path: "m", max_iterations: 1.5 })).toBe(
      false,
    );
    expect(tool.validate.errors?.map((e) => [e.instancePath, e.keyword])).toEqual([
      ["/max_iterations", "type"],
    ]);
    expect(tool.validate({ model_path: "m" })).toBe(false);
    expect(tool.validate.errors?.map((e) => e.params)).toEqual([
      { missingProperty: "input_structure" },
    ]);
  });

  it("knows the standard formats", () => {
    const tool = compileTool(
      definition({
        type: "object",
        properties: {
          email: { type: "string", format: "email" },
          when: { type: "string", format: "date-time" },
          link: { type: "string", format: "uri" },
        },
      }),
      1,
    );
    expect(
      tool.validate({
        email: "a@example.com",
        when: "2024-05-01T10:00:00Z",
        link: "https://example.com/x",
      }),
    ).toBe(true);
    expect(tool.validate({ email: "nope", when: "yesterday", link: "not a uri" })).toBe(false);
    expect(tool.validate.errors?.map((e) => e.params["format"])).toEqual([
      "email",
      "date-time",
      "uri",
    ]);
  });

  it("ignores formatMinimum rather than failing at validation time", () => {
    // ajv-formats resolves a second copy of ajv here; its limit keywords would throw a
    // TypeError on every call. They are switched off, so the keyword is ignored.
    const tool = compileTool(
      definition({
        type: "object",
        properties: { d: { type: "string", format: "date", formatMinimum: "2020-01-01" } },
      }),
      1,
    );
    expect(tool.validate({ d: "2019-01-01" })).toBe(true);
    expect(tool.validate({ d: "not a date" })).toBe(false);
  });

  it("treats inherited Object.prototype members as absent", () => {
    const tool = compileTool(
      definition({
        type: "object",
        required: ["constructor"],
        properties: { constructor: { type: "string" }, toString: { type: "string" } },
      }),
      1,
    );
    expect(tool.validate({ constructor: "x" })).toBe(true);
    expect(tool.validate({})).toBe(false);
    expect(tool.validate.errors?.map((e) => [e.keyword, e.params])).toEqual([
      ["required", { missingProperty: "constructor" }],
    ]);
  });

  it("accepts a draft-07 `$schema` (as many MCP servers send) and validates as 2020-12", () => {
    const def = definition({
      $schema: "http://json-schema.org/draft-07/schema#",
      type: "object",
      properties: { a: { type: "integer" } },
    });
    const tool = compileTool(def, 1);
    expect(tool.validate({ a: 1 })).toBe(true);
    expect(tool.validate({ a: "1" })).toBe(false);
    expect(tool.schema["$schema"]).toBe("http://json-schema.org/draft-07/schema#");
  });

  it("resolves local and recursive $refs after the schema is forgotten", () => {
    const tool = compileTool(
      definition({
        $id: "https://tools.example/tree",
        type: "object",
        properties: { root: { $ref: "#/$defs/node" } },
        $defs: {
          node: {
            type: "object",
            properties: {
              value: { type: "integer" },
              children: { type: "array", items: { $ref: "#/$defs/node" } },
            },
          },
        },
      }),
      1,
    );
    expect(tool.properties[0]?.type).toBe("dict");
    expect(tool.validate({ root: { value: 1, children: [{ value: 2, children: [] }] } })).toBe(
      true,
    );
    expect(tool.validate({ root: { value: 1, children: [{ value: "two" }] } })).toBe(false);
    expect(tool.validate.errors?.[0]?.instancePath).toBe("/root/children/0/value");
  });

  it("can compile a tool again with a new definition and the same $id, leaving nothing behind", () => {
    const ajv = getSharedAjv();
    const cache = (ajv as unknown as { _cache: Map<unknown, unknown> })._cache;
    compileTool(definition({ type: "object" }), 0); // the meta-schemas are compiled on first use
    const refsBefore = Object.keys(ajv.refs).sort();
    const cacheBefore = cache.size;
    for (let revision = 1; revision <= 20; revision += 1) {
      const tool = compileTool(
        definition({
          $id: "https://tools.example/same",
          type: "object",
          properties: {
            n: { type: "integer", maximum: revision },
            inner: { $id: "https://tools.example/inner", type: "object" },
          },
        }),
        revision,
      );
      expect(tool.validate({ n: revision })).toBe(true);
      expect(tool.validate({ n: revision + 1 })).toBe(false);
    }
    expect(Object.keys(ajv.refs).sort()).toEqual(refsBefore);
    expect(cache.size).toBe(cacheBefore);
  });

  it("leaves nothing behind when a schema does not compile", () => {
    const ajv = getSharedAjv();
    const cache = (ajv as unknown as { _cache: Map<unknown, unknown> })._cache;
    compileTool(definition({ type: "object" }), 0);
    const refsBefore = Object.keys(ajv.refs).length;
    const cacheBefore = cache.size;
    expect(() =>
      compileTool(definition({ $id: "https://tools.example/bad", type: "strin" }), 1),
    ).toThrow(ToolmeshError);
    expect(Object.keys(ajv.refs).length).toBe(refsBefore);
    expect(cache.size).toBe(cacheBefore);
  });

  it("reuses one Ajv instance", () => {
    expect(getSharedAjv()).toBe(getSharedAjv());
  });

  it("turns a schema Ajv rejects into invalid_request naming the tool", () => {
    const err = thrown(() =>
      compileTool(
        definition(
          { type: "object", properties: { a: { type: "strin" } } },
          { name: "broken_tool" },
        ),
        1,
      ),
    );
    expect(err.code).toBe(ErrorCode.InvalidRequest);
    expect(err.message).toContain('"broken_tool"');
    expect(err.details?.["tool"]).toBe("broken_tool");
    expect(err.cause).toBeInstanceOf(Error);
  });

  it("turns an unresolvable $ref into invalid_request", () => {
    const err = thrown(() =>
      compileTool(definition({ type: "object", properties: { a: { $ref: "#/$defs/nope" } } }), 1),
    );
    expect(err.code).toBe(ErrorCode.InvalidRequest);
    expect(String(err.details?.["reason"])).toContain("#/$defs/nope");
  });

  it.each([
    ['{"type":"object","properties":{"__proto__":{"type":"object"}}}', "/properties/__proto__"],
    [
      '{"type":"object","properties":{"a":{"type":"object","default":{"__proto__":{"polluted":true}}}}}',
      "/properties/a/default/__proto__",
    ],
    [
      '{"type":"object","properties":{"a/b":{"enum":[{"__proto__":1}]}}}',
      "/properties/a~1b/enum/0/__proto__",
    ],
  ])("refuses a schema holding a __proto__ key: %s", (json, path) => {
    const err = thrown(() =>
      compileTool(definition(JSON.parse(json) as Record<string, unknown>), 1),
    );
    expect(err.code).toBe(ErrorCode.InvalidRequest);
    expect(err.details).toEqual({ tool: "t", path });
    expect(({} as Record<string, unknown>)["polluted"]).toBeUndefined();
  });

  it("tolerates a schema without properties, and odd property schemas", () => {
    expect(compileTool(definition({ type: "object" }), 1).properties).toEqual([]);
    const tool = compileTool(
      definition({ type: "object", properties: { any: true, never: false } }),
      1,
    );
    expect(tool.properties.map((p) => [p.name, p.type, p.hasDefault])).toEqual([
      ["any", "str", false],
      ["never", "str", false],
    ]);
    expect(tool.validate({ any: 1 })).toBe(true);
    expect(tool.validate({ never: 1 })).toBe(false);
  });

  it("is frozen", () => {
    const tool = compileTool(definition(OPTIMIZE_STRUCTURE), 1);
    expect(Object.isFrozen(tool)).toBe(true);
    expect(Object.isFrozen(tool.properties)).toBe(true);
    expect(Object.isFrozen(tool.properties[0])).toBe(true);
  });
});

describe("paramTypeOf", () => {
  it.each([
    [{ type: "string" }, "str"],
    [{ type: "integer" }, "int"],
    [{ type: "number" }, "float"],
    [{ type: "boolean" }, "bool"],
    [{ type: "array" }, "list"],
    [{ type: "object" }, "dict"],
    [{ type: "null" }, "str"],
    [{ type: "whatever" }, "str"],
    [{ type: ["null", "integer"] }, "int"],
    [{ type: ["number", "string"] }, "float"],
    [{ type: ["null"] }, "str"],
    [{ anyOf: [{ type: "null" }, { type: "number" }] }, "float"],
    [{ oneOf: [{ type: "null" }, { $ref: "#/$defs/x" }] }, "dict"],
    [{ anyOf: [{ type: "null" }] }, "str"],
    [{ anyOf: "nonsense" }, "str"],
    [{ $ref: "#/$defs/x" }, "dict"],
    [{ properties: { a: {} } }, "dict"],
    [{ enum: ["a", "b"] }, "str"],
    [{ enum: [1, 2, null] }, "int"],
    [{ enum: [1, 2.5] }, "float"],
    [{ enum: [2.5, 1] }, "float"],
    [{ enum: [true, false] }, "bool"],
    [{ enum: ["a", 1] }, "str"],
    [{ enum: [[1], [2]] }, "list"],
    [{ enum: [{ a: 1 }] }, "dict"],
    [{ const: true }, "bool"],
    [{ const: null }, "str"],
    [{ description: "nothing said" }, "str"],
    [true, "str"],
    ["not a schema", "str"],
  ])("maps %j to %s", (schema, expected) => {
    expect(paramTypeOf(schema)).toBe(expected);
  });
});
