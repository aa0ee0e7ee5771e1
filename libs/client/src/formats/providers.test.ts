import { describe, expect, it } from "vitest";
import { ErrorCode, ToolCallSchema, ToolmeshError } from "@toolmesh/protocol";
import type { CatalogEntry } from "./catalog.js";
import { COMPACT_SCHEMA_NOTE } from "./catalog.js";
import {
  createNameMap,
  fromAnthropicContent,
  fromGeminiParts,
  fromOpenAIToolCalls,
  providerSafeName,
  toAnthropicTools,
  toGeminiSchema,
  toGeminiTools,
  toOpenAITools,
  toolNameOf,
} from "./providers.js";
import type { ProviderName } from "./providers.js";

const OPENAI_NAME = /^[a-zA-Z0-9_-]{1,64}$/;
const GEMINI_NAME = /^[a-zA-Z_][a-zA-Z0-9_.:-]{0,63}$/;

const READ_FILE_SCHEMA = {
  type: "object",
  properties: { path: { type: "string" }, encoding: { type: "string", default: "utf-8" } },
  required: ["path"],
};

/** Unsafe names on purpose: dots, spaces, unicode, a leading digit, a collision, a long one. */
const CATALOG: CatalogEntry[] = [
  { name: "fs.read_file", summary: "Read a file.", parameters: READ_FILE_SCHEMA },
  { name: "fs_read_file", summary: "A different tool that happens to look the same." },
  { name: "web search", summary: "Search the web." },
  { name: "天气", summary: "Weather." },
  { name: "3d-render", summary: "Render in 3D." },
  { name: `mcp.github.${"very_long_name_".repeat(6)}`, summary: "A long MCP tool name." },
  { name: "plain_tool", summary: "Already safe." },
];

function thrown(fn: () => unknown): ToolmeshError {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(ToolmeshError);
    return err as ToolmeshError;
  }
  throw new Error("expected a ToolmeshError, nothing was thrown");
}

describe("providerSafeName and createNameMap", () => {
  it("keeps valid names and sanitizes the others per provider", () => {
    expect(providerSafeName("plain_tool-2")).toBe("plain_tool-2");
    expect(providerSafeName("fs.read_file")).toBe("fs_read_file");
    expect(providerSafeName("fs.read_file", "anthropic")).toBe("fs_read_file");
    expect(providerSafeName("fs.read_file", "gemini")).toBe("fs.read_file");
    expect(providerSafeName("mcp:git/log", "gemini")).toBe("mcp:git_log");
    expect(providerSafeName("3d-render", "openai")).toBe("3d-render");
    expect(providerSafeName("3d-render", "gemini")).toBe("_3d-render");
    expect(providerSafeName("天气")).toBe("__");
  });

  it("cuts long names and keeps them distinct with a hash", () => {
    const a = `${"x".repeat(70)}a`;
    const b = `${"x".repeat(70)}b`;
    for (const provider of ["openai", "gemini"] as const) {
      expect(providerSafeName(a, provider)).toHaveLength(64);
      expect(providerSafeName(a, provider)).not.toBe(providerSafeName(b, provider));
      expect(providerSafeName(a, provider)).toBe(providerSafeName(a, provider));
    }
  });

  it.each<ProviderName>(["openai", "anthropic", "gemini"])(
    "maps a catalog to unique valid %s names and back",
    (provider) => {
      const map = createNameMap(
        CATALOG.map((entry) => entry.name),
        provider,
      );
      const valid = provider === "gemini" ? GEMINI_NAME : OPENAI_NAME;
      const safeNames = [...map.toProvider.values()];
      expect(new Set(safeNames).size).toBe(CATALOG.length);
      for (const entry of CATALOG) {
        const safe = map.toProvider.get(entry.name);
        expect(safe).toMatch(valid);
        expect(toolNameOf(safe ?? "", map)).toBe(entry.name);
      }
      // A name that was already valid always keeps itself.
      expect(map.toProvider.get("fs_read_file")).toBe("fs_read_file");
      expect(map.toProvider.get("plain_tool")).toBe("plain_tool");
    },
  );

  it("does not depend on catalog order", () => {
    const names = ["a.b", "a:b", "a_b", "c.d"];
    const forward = createNameMap(names);
    const backward = createNameMap([...names].reverse());
    for (const name of names) {
      expect(backward.toProvider.get(name)).toBe(forward.toProvider.get(name));
    }
    expect(forward.toProvider.get("c.d")).toBe("c_d");
    expect(forward.toProvider.get("a_b")).toBe("a_b");
    expect(forward.toProvider.get("a.b")).toMatch(/^a_b_[0-9a-f]{8}$/);
  });

  it("rejects duplicate tool names", () => {
    const error = thrown(() => createNameMap(["a", "b", "a"]));
    expect(error.code).toBe(ErrorCode.InvalidRequest);
    expect(error.details).toEqual({ tool: "a" });
  });

  it("passes unknown provider names through", () => {
    expect(toolNameOf("hallucinated", createNameMap(["x"]))).toBe("hallucinated");
    expect(toolNameOf("fs_read_file")).toBe("fs_read_file");
  });
});

describe("OpenAI", () => {
  it("declares expanded and compact entries", () => {
    const { tools } = toOpenAITools([
      {
        name: "fs.read_file",
        summary: "Read a file.",
        description: "Read a file from the workspace.",
        parameters: READ_FILE_SCHEMA,
      },
      { name: "web.search", summary: "Search the web." },
      { name: "rootless", summary: "No root type.", parameters: { properties: { a: {} } } },
    ]);
    expect(tools).toEqual([
      {
        type: "function",
        function: {
          name: "fs_read_file",
          description: "Read a file from the workspace.",
          parameters: READ_FILE_SCHEMA,
        },
      },
      {
        type: "function",
        function: {
          name: "web_search",
          description: `Search the web. (${COMPACT_SCHEMA_NOTE})`,
          parameters: { type: "object", properties: {}, additionalProperties: true },
        },
      },
      {
        type: "function",
        function: {
          name: "rootless",
          description: "No root type.",
          parameters: { type: "object", properties: { a: {} } },
        },
      },
    ]);
  });

  it("round-trips calls to unsafe names", () => {
    const { tools, nameMap } = toOpenAITools(CATALOG);
    // What the API returns when the model calls every declared function.
    const message = {
      role: "assistant",
      content: null,
      tool_calls: tools.map((tool, index) => ({
        id: `call_${index}`,
        type: "function",
        function: { name: tool.function.name, arguments: `{"i": ${index}}` },
      })),
    };
    const calls = fromOpenAIToolCalls(message.tool_calls, nameMap);
    expect(calls.map((call) => call.function.name)).toEqual(CATALOG.map((entry) => entry.name));
    expect(calls[3]).toEqual({
      id: "call_3",
      type: "function",
      function: { name: "天气", arguments: '{"i": 3}' },
    });
    for (const call of calls) expect(ToolCallSchema.parse(call)).toEqual(call);
  });

  it("keeps string arguments verbatim, serializes objects, and skips non-function entries", () => {
    const calls = fromOpenAIToolCalls([
      { id: "1", type: "function", function: { name: "a", arguments: "{not json" } },
      { id: "2", function: { name: "b", arguments: { x: 1 } } },
      { id: "3", type: "function", function: { name: "c" } },
      { id: "4", type: "custom", function: { name: "d", arguments: "raw" } },
    ]);
    expect(calls.map((call) => [call.id, call.function.arguments])).toEqual([
      ["1", "{not json"],
      ["2", '{"x":1}'],
      ["3", "{}"],
    ]);
    expect(fromOpenAIToolCalls(undefined)).toEqual([]);
    expect(fromOpenAIToolCalls(null)).toEqual([]);
  });
});

describe("Anthropic", () => {
  it("declares tools with input_schema", () => {
    const { tools } = toAnthropicTools([
      { name: "fs.read_file", summary: "Read a file.", parameters: READ_FILE_SCHEMA },
      { name: "web.search", summary: "Search the web." },
    ]);
    expect(tools).toEqual([
      { name: "fs_read_file", description: "Read a file.", input_schema: READ_FILE_SCHEMA },
      {
        name: "web_search",
        description: `Search the web. (${COMPACT_SCHEMA_NOTE})`,
        input_schema: { type: "object", properties: {}, additionalProperties: true },
      },
    ]);
  });

  it("round-trips tool_use blocks and skips other blocks", () => {
    const { tools, nameMap } = toAnthropicTools(CATALOG);
    const content = [
      { type: "thinking", thinking: "I should read the file and search." },
      { type: "text", text: "Let me check." },
      ...tools.map((tool, index) => ({
        type: "tool_use",
        id: `toolu_${index}`,
        name: tool.name,
        input: { i: index, nested: { ok: true } },
      })),
      { type: "server_tool_use", id: "srvtoolu_1", name: "web_search", input: { query: "x" } },
    ];
    const calls = fromAnthropicContent(content, nameMap);
    expect(calls.map((call) => call.function.name)).toEqual(CATALOG.map((entry) => entry.name));
    expect(calls[0]).toEqual({
      id: "toolu_0",
      type: "function",
      function: { name: "fs.read_file", arguments: '{"i":0,"nested":{"ok":true}}' },
    });
    expect(
      fromAnthropicContent([{ type: "tool_use", id: "t", name: "clock" }])[0]?.function,
    ).toEqual({ name: "clock", arguments: "{}" });
    expect(fromAnthropicContent(undefined)).toEqual([]);
  });
});

describe("Gemini", () => {
  it("declares tools in one function_declarations entry, without parameters when empty", () => {
    const { tools, nameMap } = toGeminiTools([
      { name: "fs.read_file", summary: "Read a file.", parameters: READ_FILE_SCHEMA },
      { name: "web search", summary: "Search the web." },
      { name: "clock", summary: "Now.", parameters: { type: "object", properties: {} } },
    ]);
    expect(tools).toEqual([
      {
        function_declarations: [
          {
            name: "fs.read_file",
            description: "Read a file.",
            parameters: {
              type: "object",
              properties: { path: { type: "string" }, encoding: { type: "string" } },
              required: ["path"],
            },
          },
          { name: "web_search", description: `Search the web. (${COMPACT_SCHEMA_NOTE})` },
          { name: "clock", description: "Now." },
        ],
      },
    ]);
    expect(nameMap.provider).toBe("gemini");
    expect(toGeminiTools([]).tools).toEqual([]);
  });

  it("round-trips function calls, generating ids where Gemini sends none", () => {
    const { tools, nameMap } = toGeminiTools(CATALOG);
    const declarations = tools[0]?.function_declarations ?? [];
    const parts = [
      { text: "Let me look." },
      ...declarations.map((declaration, index) => ({
        functionCall: { name: declaration.name, args: { i: index } },
      })),
      { function_call: { name: "clock", id: "server-id-1" } },
      { thoughtSignature: "abc", functionCall: { name: "plain_tool", args: {}, id: "" } },
    ];
    const calls = fromGeminiParts(parts, nameMap);
    expect(calls.map((call) => call.function.name)).toEqual([
      ...CATALOG.map((entry) => entry.name),
      "clock",
      "plain_tool",
    ]);
    expect(calls.map((call) => call.id)).toEqual([
      ...CATALOG.map((_, index) => `gemini-${index}`),
      "server-id-1",
      `gemini-${CATALOG.length + 1}`,
    ]);
    expect(calls[CATALOG.length]?.function.arguments).toBe("{}");
    expect(calls[1]?.function.arguments).toBe('{"i":1}');
    for (const call of calls) expect(ToolCallSchema.parse(call)).toEqual(call);
  });

  it("generates the same ids for the same parts, with a per-turn prefix on request", () => {
    const parts = [{ functionCall: { name: "a", args: {} } }, { functionCall: { name: "b" } }];
    expect(fromGeminiParts(parts).map((call) => call.id)).toEqual(["gemini-0", "gemini-1"]);
    expect(fromGeminiParts(parts).map((call) => call.id)).toEqual(["gemini-0", "gemini-1"]);
    expect(fromGeminiParts(parts, undefined, { idPrefix: "t7" }).map((call) => call.id)).toEqual([
      "t7-0",
      "t7-1",
    ]);
  });
});

describe("toGeminiSchema", () => {
  it("drops what Gemini rejects and rewrites nullability, const and oneOf", () => {
    const schema = {
      $schema: "https://json-schema.org/draft/2020-12/schema",
      $id: "urn:tool",
      title: "Args",
      type: "object",
      additionalProperties: false,
      properties: {
        name: { type: ["string", "null"], default: null, examples: ["x"], title: "Name" },
        mode: { const: "fast" },
        level: { type: "integer", enum: [1, 2, 3], description: "How hard." },
        tag: { enum: ["a", "b", null] },
        when: { type: "string", format: "date-time" },
        url: { type: "string", format: "uri", pattern: "^https://" },
        count: { type: "integer", format: "int64", minimum: 0, exclusiveMaximum: 10 },
        ratio: { type: "number", format: "double", multipleOf: 0.5 },
        id: { type: ["string", "integer"] },
        either: { oneOf: [{ type: "string" }, { type: "number" }] },
        list: { type: "array", items: { type: "string" }, minItems: 1, uniqueItems: true },
        free: { type: "object", additionalProperties: { type: "string" } },
        empty: { type: "object", properties: {} },
      },
      required: ["name", "ghost"],
    };
    expect(toGeminiSchema(schema)).toEqual({
      type: "object",
      properties: {
        name: { type: "string", nullable: true },
        mode: { type: "string", enum: ["fast"] },
        level: { type: "integer", description: "How hard. Allowed values: 1, 2, 3." },
        tag: { type: "string", enum: ["a", "b"], nullable: true },
        when: { type: "string", format: "date-time" },
        url: { type: "string", pattern: "^https://" },
        count: { type: "integer", format: "int64", minimum: 0 },
        ratio: { type: "number", format: "double" },
        id: { anyOf: [{ type: "string" }, { type: "integer" }] },
        either: { anyOf: [{ type: "string" }, { type: "number" }] },
        list: { type: "array", items: { type: "string" }, minItems: 1 },
        free: { type: "object" },
        empty: { type: "object" },
      },
      required: ["name"],
    });
  });

  it("turns pydantic's Optional (anyOf with null) into nullable", () => {
    const schema = {
      type: "object",
      properties: {
        limit: {
          anyOf: [{ type: "integer", minimum: 1 }, { type: "null" }],
          default: null,
          description: "Max results.",
          title: "Limit",
        },
        kind: { anyOf: [{ type: "string" }, { type: "integer" }, { type: "null" }] },
      },
    };
    expect(toGeminiSchema(schema)).toEqual({
      type: "object",
      properties: {
        limit: { type: "integer", minimum: 1, description: "Max results.", nullable: true },
        kind: { anyOf: [{ type: "string" }, { type: "integer" }], nullable: true },
      },
    });
  });

  it("inlines local $refs, lets siblings win, and cuts recursion", () => {
    const schema = {
      type: "object",
      $defs: {
        Point: {
          type: "object",
          properties: { x: { type: "number" }, y: { type: "number" } },
          required: ["x", "y"],
          description: "A point.",
        },
        Tree: {
          type: "object",
          properties: {
            label: { type: "string" },
            children: { type: "array", items: { $ref: "#/$defs/Tree" } },
          },
        },
      },
      definitions: { Color: { type: "string", enum: ["red", "green"] } },
      properties: {
        from: { $ref: "#/$defs/Point", description: "Start." },
        to: { allOf: [{ $ref: "#/$defs/Point" }] },
        color: { $ref: "#/definitions/Color" },
        tree: { $ref: "#/$defs/Tree" },
        remote: { $ref: "https://example.com/schema.json", description: "Elsewhere." },
      },
    };
    const point = {
      type: "object",
      properties: { x: { type: "number" }, y: { type: "number" } },
      required: ["x", "y"],
    };
    expect(toGeminiSchema(schema)).toEqual({
      type: "object",
      properties: {
        from: { ...point, description: "Start." },
        to: { ...point, description: "A point." },
        color: { type: "string", enum: ["red", "green"] },
        tree: {
          type: "object",
          properties: {
            label: { type: "string" },
            children: { type: "array", items: { type: "object" } },
          },
        },
        remote: { description: "Elsewhere." },
      },
    });
  });

  it("does not modify its input", () => {
    const schema = structuredClone(READ_FILE_SCHEMA);
    toGeminiSchema(schema);
    expect(schema).toEqual(READ_FILE_SCHEMA);
  });
});
