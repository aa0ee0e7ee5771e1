import { describe, expect, it } from "vitest";
import { ErrorCode, ToolDefinitionSchema, ToolmeshError } from "@toolmesh/protocol";
import type { ToolDefinition } from "@toolmesh/protocol";
import { compileTool, getSharedAjv, linearRegExp, paramTypeOf } from "./compile.js";

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

/** The example tool `optimize_structure`, with `executor` made required to prove it is dropped. */
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

  it("removes system params from `properties` and `required` in the model-facing schema without touching the definition", () => {
    const def = definition(OPTIMIZE_STRUCTURE);
    const tool = compileTool(def, 1);
    expect(tool.schema["required"]).toEqual(["input_structure", "model_path"]);
    expect(Object.keys(tool.schema["properties"] as object)).not.toContain("executor");
    expect(Object.keys(tool.schema["properties"] as object)).not.toContain("storage");
    expect(Object.keys(def.parameters["properties"] as object)).toContain("executor");
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

describe("patterns run on a linear-time engine", () => {
  const stringWith = (pattern: string): ToolDefinition =>
    definition({ type: "object", properties: { s: { type: "string", pattern } } });

  it("is the engine of the shared Ajv", () => {
    expect(getSharedAjv().opts.code.regExp).toBe(linearRegExp);
  });

  it("validates a hostile string against a catastrophically backtracking pattern at once", () => {
    const tool = compileTool(stringWith("^(a+)+$"), 1);
    const hostile = `${"a".repeat(30)}!`;
    // No clock: V8's backtracking engine needs minutes here (past the test's timeout), RE2
    // microseconds.
    expect(tool.validate({ s: hostile })).toBe(false);
    expect(tool.validate.errors?.map((e) => [e.instancePath, e.keyword])).toEqual([
      ["/s", "pattern"],
    ]);
    expect(tool.validate({ s: "a".repeat(30) })).toBe(true);
  }, 20_000);

  it("checks property names against a hostile patternProperties key at once", () => {
    const tool = compileTool(
      definition({
        type: "object",
        patternProperties: { "^(a|aa)+$": { type: "integer" } },
        additionalProperties: false,
      }),
      1,
    );
    expect(tool.validate({ [`${"a".repeat(40)}!`]: 1 })).toBe(false);
    expect(tool.validate.errors?.[0]?.keyword).toBe("additionalProperties");
    expect(tool.validate({ aaa: 1 })).toBe(true);
    expect(tool.validate({ aaa: "one" })).toBe(false);
  }, 20_000);

  it("stays linear on a large input", () => {
    const tool = compileTool(stringWith("^(\\w+\\s?)*$"), 1);
    expect(tool.validate({ s: `${"word ".repeat(20_000)}!` })).toBe(false);
  }, 20_000);

  // Each pattern is run by the engine and by V8 on the same inputs: the answers must agree.
  it.each([
    ["^[a-z]+$", ["abc", "", "abC", "ab1", "abc\n"]],
    ["\\d{3}", ["123", "ab1234", "12", "١٢٣"]],
    ["^\\w+@\\w+\\.com$", ["a@b.com", "a@b.org", "é@b.com"]],
    ["^\\p{L}+$", ["héllo", "日本語", "abc1", "Ωμέγα", ""]],
    ["^\\p{Lu}\\P{Lu}*$", ["Hello", "hello", "HEllo"]],
    ["^\\p{Letter}+$", ["héllo", "a1"]],
    ["^\\p{Script=Greek}+$", ["Ωμέγα", "omega"]],
    ["^\\p{sc=Han}+$", ["中文", "中a"]],
    ["^\\p{gc=Nd}+$", ["123", "١٢٣", "1a"]],
    ["^[\\u4e00-\\u9fa5]+$", ["中文", "中文a", "日本"]],
    ["^\\u00e9$", ["é", "e"]],
    ["^\\u{1F600}$", ["😀", "😁"]],
    ["^\\ud83d\\ude00$", ["😀", "😁"]],
    ["^😀+$", ["😀😀", "😀a"]],
    ["^.$", ["a", "😀", "\n", "\r", "\u2028", "\t"]],
    ["^\\s$", [" ", "\t", "\v", "\u00a0", "\u3000", "\ufeff", "a"]],
    ["^\\S+$", ["abc", "a b", "a\u00a0b"]],
    ["^[\\s\\S]*$", ["anything\n at all", ""]],
    ["^[^\\s]+$", ["abc", "a\u00a0b"]],
    ["^[\\b]$", ["\b", "b"]],
    ["\\bcat\\b", ["a cat here", "concatenate"]],
    ["^\\cJ$", ["\n", "J"]],
    ["^a\\0b$", ["a\u0000b", "a0b"]],
    ["^(?<year>\\d{4})-(?<month>\\d{2})$", ["2024-05", "24-05"]],
    ["^[[:alpha:]+$", ["[:ahl", "b"]],
    ["^\\p{Emoji}\\p{Alphabetic}$", ["😀a", "😀1"]],
    ["^a[]$", ["a"]],
    ["^a[^]$", ["ab", "a\n", "a"]],
    ["^\\x41\\/\\.$", ["A/.", "A/x"]],
    ["^(?:ab|cd){2,3}$", ["abcd", "ab", "abcdabab"]],
    ["^[\\-+]?\\d+(\\.\\d+)?$", ["-1.5", "+2", "1.", "--1"]],
    ["colou?r", ["color", "colour", "colr"]],
    ["", ["", "anything"]],
  ])("agrees with ECMAScript on %s", (pattern, inputs) => {
    const native = new RegExp(pattern, "u");
    const linear = linearRegExp(pattern, "u");
    for (const input of inputs) {
      expect([input, linear.test(input)]).toEqual([input, native.test(input)]);
    }
    const tool = compileTool(stringWith(pattern), 1);
    for (const input of inputs) {
      expect([input, tool.validate({ s: input })]).toEqual([input, native.test(input)]);
    }
  });

  it("does not throw on strings holding lone surrogates", () => {
    const tool = compileTool(stringWith("^.+$"), 1);
    expect(tool.validate({ s: "a\ud800b" })).toBe(true);
    expect(tool.validate({ s: "\udc00" })).toBe(true);
  });

  it("caches distinct patterns apart", () => {
    const tool = compileTool(
      definition({
        type: "object",
        properties: {
          a: { type: "string", pattern: "^a+$" },
          b: { type: "string", pattern: "^b+$" },
        },
      }),
      1,
    );
    expect(tool.validate({ a: "aa", b: "bb" })).toBe(true);
    expect(tool.validate({ a: "bb", b: "aa" })).toBe(false);
    expect(String(linearRegExp("^a+$", "u"))).toBe("/^a+$/u");
  });

  it.each([
    ["(a)\\1", "backreferences are not supported"],
    ["(?<n>a)\\k<n>", "backreferences are not supported"],
    ["(a)(b)(c)(d)(e)(f)(g)(h)(i)\\9", "backreferences are not supported"],
    ["a(?=b)", "lookahead is not supported"],
    ["a(?!b)", "lookahead is not supported"],
    ["(?<=a)b", "lookbehind is not supported"],
    ["(?<!a)b", "lookbehind is not supported"],
    ["^\\p{ASCII}$", "RE2"],
    ["^\\p{sc=Grek}$", "RE2"],
    ["^\\p{scx=Greek}$", "\\p{scx=Greek} is not supported"],
    ["^a{1001}$", "RE2"],
    ["^\\ud800$", "lone surrogate"],
    ["(", "not a valid ECMAScript regular expression"],
    ["\\e", "not a valid ECMAScript regular expression"],
  ])("refuses %s at compile time, naming the tool and the pattern", (pattern, reason) => {
    const err = thrown(() => compileTool({ ...stringWith(pattern), name: "rx_tool" }, 1));
    expect(err.code).toBe(ErrorCode.InvalidRequest);
    expect(err.message).toContain('"rx_tool"');
    expect(err.message).toContain(JSON.stringify(pattern));
    expect(err.details).toMatchObject({ tool: "rx_tool", pattern, path: "/properties/s/pattern" });
    expect(String(err.details?.["reason"])).toContain(reason);
  });

  it("names where a refused pattern is, in patternProperties and nested schemas too", () => {
    const keyed = thrown(() =>
      compileTool(
        definition({
          type: "object",
          properties: {
            tags: { type: "object", patternProperties: { "^(x)\\1$": { type: "string" } } },
          },
        }),
        1,
      ),
    );
    expect(keyed.details).toMatchObject({
      pattern: "^(x)\\1$",
      path: "/properties/tags/patternProperties/^(x)\\1$",
    });
    const nested = thrown(() =>
      compileTool(
        definition({
          type: "object",
          properties: {
            list: { type: "array", items: { type: "string", pattern: "a(?=b)" } },
          },
        }),
        1,
      ),
    );
    expect(nested.details).toMatchObject({ path: "/properties/list/items/pattern" });
  });

  it("leaves nothing behind when a pattern is refused", () => {
    const ajv = getSharedAjv();
    const cache = (ajv as unknown as { _cache: Map<unknown, unknown> })._cache;
    compileTool(definition({ type: "object" }), 0);
    const refsBefore = Object.keys(ajv.refs).length;
    const cacheBefore = cache.size;
    expect(() =>
      compileTool(
        definition({
          $id: "https://tools.example/refused",
          type: "object",
          properties: { s: { type: "string", pattern: "(a)\\1" } },
        }),
        1,
      ),
    ).toThrow(ToolmeshError);
    expect(Object.keys(ajv.refs).length).toBe(refsBefore);
    expect(cache.size).toBe(cacheBefore);
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
