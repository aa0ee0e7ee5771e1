import { describe, expect, it } from "vitest";
import { ErrorCode, ToolCallSchema, ToolmeshError } from "@toolmesh/protocol";
import type { ToolCall } from "@toolmesh/protocol";
import type { CatalogEntry } from "./catalog.js";
import { COMPACT_SCHEMA_NOTE } from "./catalog.js";
import { parseToolCallsFromText, renderToolPrompt } from "./fallback.js";

const FENCE = "```";

function thrown(fn: () => unknown): ToolmeshError {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(ToolmeshError);
    return err as ToolmeshError;
  }
  throw new Error("expected a ToolmeshError, nothing was thrown");
}

/** name and parsed arguments of each call, for compact assertions. */
function summary(calls: ToolCall[]): { name: string; args: unknown }[] {
  return calls.map((call) => {
    expect(typeof call.function.arguments).toBe("string");
    return { name: call.function.name, args: JSON.parse(call.function.arguments as string) };
  });
}

describe("parseToolCallsFromText: calls found", () => {
  it("reads a single call in a json fence and removes the fence from the prose", () => {
    const text = [
      "I'll look that file up.",
      "",
      `${FENCE}json`,
      '{"name": "fs.read_file", "parameters": {"path": "/etc/hosts"}}',
      FENCE,
    ].join("\n");
    const result = parseToolCallsFromText(text);
    expect(result.calls).toEqual([
      {
        id: "fallback-0",
        type: "function",
        function: { name: "fs.read_file", arguments: '{"path":"/etc/hosts"}' },
      },
    ]);
    expect(result.text).toBe("I'll look that file up.");
    for (const call of result.calls) expect(ToolCallSchema.parse(call)).toEqual(call);
  });

  it("reads a fenced array as several calls, numbered in order", () => {
    const text = [
      `${FENCE}json`,
      "[",
      '  {"name": "weather", "parameters": {"city": "Paris"}},',
      '  {"name": "weather", "parameters": {"city": "Berlin"}},',
      '  {"name": "clock", "parameters": {}}',
      "]",
      FENCE,
    ].join("\n");
    const { calls, text: prose } = parseToolCallsFromText(text);
    expect(calls.map((call) => call.id)).toEqual(["fallback-0", "fallback-1", "fallback-2"]);
    expect(summary(calls)).toEqual([
      { name: "weather", args: { city: "Paris" } },
      { name: "weather", args: { city: "Berlin" } },
      { name: "clock", args: {} },
    ]);
    expect(prose).toBe("");
  });

  it("reads two fences in a row, keeping the prose between them", () => {
    const text = [
      "First the search:",
      `${FENCE}json`,
      '{"name": "search", "parameters": {"q": "nats jetstream"}}',
      FENCE,
      "then the fetch:",
      `${FENCE}json`,
      '{"name": "fetch", "arguments": {"url": "https://nats.io"}}',
      FENCE,
    ].join("\n");
    const result = parseToolCallsFromText(text, { idPrefix: "turn-3" });
    expect(summary(result.calls)).toEqual([
      { name: "search", args: { q: "nats jetstream" } },
      { name: "fetch", args: { url: "https://nats.io" } },
    ]);
    expect(result.calls.map((call) => call.id)).toEqual(["turn-3-0", "turn-3-1"]);
    expect(result.text).toBe("First the search:\n\nthen the fetch:");
  });

  it("finds bare JSON in the middle of prose", () => {
    const text =
      'Sure. {"name": "calculator", "parameters": {"expression": "2 + 2"}} Let me compute that.';
    const result = parseToolCallsFromText(text);
    expect(summary(result.calls)).toEqual([{ name: "calculator", args: { expression: "2 + 2" } }]);
    expect(result.text).toBe("Sure. Let me compute that.");
  });

  it("finds several bare calls in a row and on separate lines", () => {
    const text = [
      'Calling both: {"name": "a", "parameters": {"x": 1}}{"name": "b", "parameters": {"y": 2}}',
      '{"tool": "c", "arguments": {"z": [1, 2, {"w": null}]}}',
      "Done.",
    ].join("\n");
    const result = parseToolCallsFromText(text);
    expect(summary(result.calls)).toEqual([
      { name: "a", args: { x: 1 } },
      { name: "b", args: { y: 2 } },
      { name: "c", args: { z: [1, 2, { w: null }] } },
    ]);
    expect(result.text).toBe("Calling both:\n\nDone.");
  });

  it("is not fooled by braces and brackets inside strings", () => {
    const text =
      'Running: {"name": "shell", "parameters": {"cmd": "echo \'}\' && awk \'{print $1}\' [x]"}} ok';
    const result = parseToolCallsFromText(text);
    expect(summary(result.calls)).toEqual([
      { name: "shell", args: { cmd: "echo '}' && awk '{print $1}' [x]" } },
    ]);
    expect(result.text).toBe("Running: ok");
  });

  it("handles escaped quotes and backslashes inside strings", () => {
    const text = String.raw`{"name": "write_file", "parameters": {"path": "C:\\tmp\\a.txt", "content": "say \"hi\" and {not a brace}\\"}}`;
    const result = parseToolCallsFromText(text);
    expect(summary(result.calls)).toEqual([
      {
        name: "write_file",
        args: { path: "C:\\tmp\\a.txt", content: 'say "hi" and {not a brace}\\' },
      },
    ]);
  });

  it("does not end a string at an escaped quote", () => {
    const text = String.raw`Run {"name": "echo", "parameters": {"s": "quote \" then }"}} done`;
    const result = parseToolCallsFromText(text);
    expect(summary(result.calls)).toEqual([{ name: "echo", args: { s: 'quote " then }' } }]);
    expect(result.text).toBe("Run done");
  });

  it("accepts arguments given as a JSON string, kept as the model wrote them", () => {
    const text = `${FENCE}json\n{"name": "search", "arguments": "{\\"q\\": \\"cats\\", \\"limit\\": 3}"}\n${FENCE}`;
    const { calls } = parseToolCallsFromText(text);
    expect(calls[0]?.function.arguments).toBe('{"q": "cats", "limit": 3}');
  });

  it("keeps nested objects and arrays intact", () => {
    const args = {
      filter: { and: [{ field: "age", gt: 30 }, { or: [{ city: "Oslo" }, { city: "Rome" }] }] },
      sort: [{ field: "name", dir: "asc" }],
      page: { size: 20, cursor: null },
    };
    const text = `Query:\n${FENCE}json\n${JSON.stringify({ name: "db.query", parameters: args }, null, 2)}\n${FENCE}`;
    expect(summary(parseToolCallsFromText(text).calls)).toEqual([{ name: "db.query", args }]);
  });

  it("keeps unicode, including escapes and astral characters", () => {
    const text =
      '我来查一下天气。{"name": "天气", "parameters": {"城市": "北京", "note": "caf\\u00e9 😀"}}谢谢';
    const result = parseToolCallsFromText(text);
    expect(summary(result.calls)).toEqual([
      { name: "天气", args: { 城市: "北京", note: "café 😀" } },
    ]);
    expect(result.text).toBe("我来查一下天气。 谢谢");
  });

  it("accepts tool_name, an untagged fence, an inline fence and the OpenAI shape", () => {
    const text = [
      FENCE,
      '{"tool_name": "a", "parameters": {"k": "v"}}',
      FENCE,
      `${FENCE}json {"name": "b", "parameters": {}}${FENCE}`,
      `${FENCE}{"type": "function", "function": {"name": "c", "arguments": "{\\"n\\": 1}"}}${FENCE}`,
    ].join("\n");
    expect(summary(parseToolCallsFromText(text).calls)).toEqual([
      { name: "a", args: { k: "v" } },
      { name: "b", args: {} },
      { name: "c", args: { n: 1 } },
    ]);
  });

  it("reads several values in one json fence and a fence glued to the last line", () => {
    const text = `${FENCE}json\n{"name": "a", "parameters": {}}\n{"name": "b", "parameters": {"x": true}}${FENCE}\nafter`;
    const result = parseToolCallsFromText(text);
    expect(summary(result.calls)).toEqual([
      { name: "a", args: {} },
      { name: "b", args: { x: true } },
    ]);
    expect(result.text).toBe("after");
  });

  it("reads calls in Hermes-style tags and CRLF text", () => {
    const text =
      '<tool_call>\r\n{"name": "get_time", "arguments": {"tz": "UTC"}}\r\n</tool_call>\r\n' +
      `${FENCE}json\r\n{"name": "get_date", "parameters": {}}\r\n${FENCE}\r\n`;
    expect(summary(parseToolCallsFromText(text).calls)).toEqual([
      { name: "get_time", args: { tz: "UTC" } },
      { name: "get_date", args: {} },
    ]);
  });

  it("treats null parameters as no arguments", () => {
    const { calls } = parseToolCallsFromText('{"name": "clock", "parameters": null}');
    expect(calls[0]?.function.arguments).toBe("{}");
  });

  it("finds a call nested in prose braces without mistaking the outer braces for a call", () => {
    const text = 'Plan { step one: {"name": "a", "parameters": {"x": 1}} } and [see above]';
    const result = parseToolCallsFromText(text);
    expect(summary(result.calls)).toEqual([{ name: "a", args: { x: 1 } }]);
    expect(result.text).toBe("Plan { step one: } and [see above]");
  });

  // No clock: a scan that went back over the run at every bracket would take some 10^10 steps
  // here, far past the test's timeout; a linear one takes milliseconds.
  it("stays linear on long runs of unclosed brackets", () => {
    const runs = [
      `${"{".repeat(200_000)} and then {"name": "a", "parameters": {}}`,
      `${'{"a": '.repeat(50_000)} and then {"name": "a", "parameters": {}}`,
    ];
    for (const text of runs)
      expect(summary(parseToolCallsFromText(text).calls)).toEqual([{ name: "a", args: {} }]);
  }, 20_000);
});

describe("parseToolCallsFromText: not calls", () => {
  it("returns no calls and the prose for plain prose", () => {
    const text = "  The capital of France is Paris. Sets look like {a, b} and lists like [1, 2].  ";
    expect(parseToolCallsFromText(text)).toEqual({
      calls: [],
      text: "The capital of France is Paris. Sets look like {a, b} and lists like [1, 2].",
    });
  });

  it("ignores valid non-call JSON in a json fence and leaves it in the prose", () => {
    const text = `The answer:\n${FENCE}json\n{"answer": 42}\n${FENCE}`;
    expect(parseToolCallsFromText(text)).toEqual({ calls: [], text });
  });

  it("ignores data that merely has a name but no parameters key", () => {
    const text = `${FENCE}json\n[{"name": "Alice", "age": 30}, {"name": "Bob", "age": 41}]\n${FENCE}`;
    expect(parseToolCallsFromText(text).calls).toEqual([]);
  });

  it("ignores a call nested inside other JSON data", () => {
    const text = '{"example": {"name": "a", "parameters": {}}}';
    expect(parseToolCallsFromText(text)).toEqual({ calls: [], text });
  });

  it("leaves fences tagged with another language alone, even when they hold call-like code", () => {
    const text = `${FENCE}python\ncall({'name': 'search', 'parameters': {'q': 'x'}})\n${FENCE}`;
    expect(parseToolCallsFromText(text)).toEqual({ calls: [], text });
  });

  it("leaves an untagged fence of non-JSON text alone", () => {
    const text = `${FENCE}\n$ ls -la {src,test}\n${FENCE}`;
    expect(parseToolCallsFromText(text)).toEqual({ calls: [], text });
  });
});

describe("parseToolCallsFromText: knownTools", () => {
  const knownTools = new Set(["search", "clock"]);

  it("drops calls to tools not offered and keeps a block of only such calls in the prose", () => {
    const text = [
      `${FENCE}json`,
      '[{"name": "search", "parameters": {"q": "x"}}, {"name": "hack_the_planet", "parameters": {}}]',
      FENCE,
      'Also {"name": "Alice", "parameters": {"role": "admin"}} is the user.',
    ].join("\n");
    const result = parseToolCallsFromText(text, { knownTools });
    expect(summary(result.calls)).toEqual([{ name: "search", args: { q: "x" } }]);
    expect(result.text).toBe(
      'Also {"name": "Alice", "parameters": {"role": "admin"}} is the user.',
    );
  });

  it("without knownTools, returns every call-shaped object so the resolver can report it", () => {
    const text = '{"name": "serch", "parameters": {"q": "x"}}';
    expect(summary(parseToolCallsFromText(text).calls)).toEqual([
      { name: "serch", args: { q: "x" } },
    ]);
  });

  it("counts a known name without parameters as a call without arguments", () => {
    const text = 'What time is it? {"name": "clock"}';
    expect(parseToolCallsFromText(text).calls).toEqual([]);
    const result = parseToolCallsFromText(text, { knownTools });
    expect(summary(result.calls)).toEqual([{ name: "clock", args: {} }]);
    expect(result.text).toBe("What time is it?");
  });
});

describe("parseToolCallsFromText: malformed output fails, never guessed", () => {
  it("reports truncated JSON in a json fence with its position", () => {
    const text = `Searching now.\n${FENCE}json\n{"name": "search", "parameters": {"q": "cats", "lim`;
    const error = thrown(() => parseToolCallsFromText(text));
    expect(error.code).toBe(ErrorCode.InvalidArguments);
    expect(error.retryable).toBe(false);
    expect(error.details).toMatchObject({
      position: text.indexOf("{"),
      line: 3,
      column: 1,
      snippet: '{"name": "search", "parameters": {"q": "cats", "lim',
    });
    expect(typeof error.details?.reason).toBe("string");
    expect(error.message).toContain("line 3");
  });

  it("reports a json fence with a trailing comma", () => {
    const text = `${FENCE}json\n{"name": "search", "parameters": {"q": "cats",}}\n${FENCE}`;
    const error = thrown(() => parseToolCallsFromText(text));
    expect(error.code).toBe(ErrorCode.InvalidArguments);
    expect(error.details?.position).toBe(text.indexOf("{"));
  });

  it("reports invalid JSON in a json fence even when it is not call-shaped", () => {
    const text = `${FENCE}json\n{answer: 42}\n${FENCE}`;
    expect(thrown(() => parseToolCallsFromText(text)).code).toBe(ErrorCode.InvalidArguments);
  });

  it("reports text after the value in a json fence", () => {
    const text = `${FENCE}json\n{"name": "a", "parameters": {}} // call a\n${FENCE}`;
    const error = thrown(() => parseToolCallsFromText(text));
    expect(error.details?.position).toBe(text.indexOf("//"));
  });

  it("reports a Python-dict-ish call with single quotes instead of guessing", () => {
    const text = "I will search. {'name': 'search', 'parameters': {'q': 'cats', 'safe': True}}";
    const error = thrown(() => parseToolCallsFromText(text));
    expect(error.code).toBe(ErrorCode.InvalidArguments);
    expect(error.details).toMatchObject({
      position: text.indexOf("{"),
      snippet: "{'name': 'search', 'parameters': {'q': 'cats', 'safe': True}}",
    });
  });

  it("reports a JS-style object with bare keys", () => {
    const text = 'Calling {name: "search", parameters: {q: "cats"}} now';
    expect(thrown(() => parseToolCallsFromText(text)).code).toBe(ErrorCode.InvalidArguments);
  });

  it("reports a bare call truncated by the token limit", () => {
    const text = 'Let me check. {"name": "search", "parameters": {"q": "how to';
    const error = thrown(() => parseToolCallsFromText(text));
    expect(error.details?.position).toBe(text.indexOf("{"));
  });

  it("reports a call cut off before its parameters, alone or in an array", () => {
    for (const text of ['Calling {"name": "sea', 'Calling [{"tool": "search"}, {"tool": "fe']) {
      const error = thrown(() => parseToolCallsFromText(text));
      expect(error.details?.position).toBe(8);
    }
  });

  it("reports call-like JSON whose first key is not the name", () => {
    const text = '{"thought": "need data", "name": "search", "parameters": {"q": 1},}';
    expect(thrown(() => parseToolCallsFromText(text)).code).toBe(ErrorCode.InvalidArguments);
  });

  it("reports arguments that are a string but not JSON", () => {
    const text = '{"name": "search", "arguments": "q=cats"}';
    const error = thrown(() => parseToolCallsFromText(text));
    expect(error.details?.reason).toMatch(/not JSON/);
  });

  it("reports arguments that are not an object", () => {
    for (const args of ["[1, 2]", '"[1]"', "7"]) {
      const error = thrown(() =>
        parseToolCallsFromText(`{"name": "search", "parameters": ${args}}`),
      );
      expect(error.details?.reason).toMatch(/not a JSON object/);
    }
  });

  it("reports a call with both parameters and arguments", () => {
    const text = '{"name": "a", "parameters": {"x": 1}, "arguments": {"x": 2}}';
    expect(thrown(() => parseToolCallsFromText(text)).details?.reason).toMatch(/both/);
  });

  it("reports a block that mixes calls and other values", () => {
    const text = `${FENCE}json\n[{"name": "a", "parameters": {}}, {"note": "then summarize"}]\n${FENCE}`;
    expect(thrown(() => parseToolCallsFromText(text)).details?.reason).toMatch(/mixes/);
  });

  it("reports calls separated by commas without an array", () => {
    const text = `${FENCE}json\n{"name": "a", "parameters": {}},\n{"name": "b", "parameters": {}}\n${FENCE}`;
    expect(thrown(() => parseToolCallsFromText(text)).code).toBe(ErrorCode.InvalidArguments);
  });
});

describe("renderToolPrompt", () => {
  const entries: CatalogEntry[] = [
    {
      name: "fs.read_file",
      summary: "Read a file.",
      description: "Read a file\nfrom the workspace.",
      parameters: {
        type: "object",
        properties: { path: { type: "string", description: "Use `/` separators, not ```" } },
        required: ["path"],
      },
    },
    { name: "web.search", summary: "Search the web." },
  ];

  it("explains the call format and lists tools, with schemas for expanded entries only", () => {
    const prompt = renderToolPrompt(entries);
    expect(prompt.startsWith("## Tools\n")).toBe(true);
    expect(prompt).toContain('{"name": "<tool name>", "parameters": {"<parameter>": "<value>"}}');
    expect(prompt).toContain("JSON array");
    expect(prompt).toContain("### `fs.read_file`\n\nRead a file from the workspace.");
    expect(prompt).toContain("### `web.search` (schema on first call)\n\nSearch the web.");
    expect(prompt).toContain(COMPACT_SCHEMA_NOTE);
    expect(prompt.match(/Parameters \(JSON Schema\)/g)).toHaveLength(1);
  });

  it("embeds schemas that parse back and cannot close their fence", () => {
    const prompt = renderToolPrompt(entries);
    const schemaText = /Parameters \(JSON Schema\):\n```json\n([\s\S]*?)\n```/.exec(prompt)?.[1];
    expect(schemaText).toBeDefined();
    expect(schemaText).not.toContain("`");
    expect(JSON.parse(schemaText ?? "")).toEqual(entries[0]?.parameters);
  });

  it("honours the options and renders nothing for no tools", () => {
    const prompt = renderToolPrompt(entries.slice(0, 1), {
      heading: "# Available tools",
      allowMultiple: false,
    });
    expect(prompt.startsWith("# Available tools\n")).toBe(true);
    expect(prompt).not.toContain("JSON array");
    expect(prompt).not.toContain("schema on first call");
    expect(renderToolPrompt([])).toBe("");
  });

  it("produces a prompt whose own example answer parses back", () => {
    const answer = `${FENCE}json\n{"name": "fs.read_file", "parameters": {"path": "a.txt"}}\n${FENCE}`;
    const { calls } = parseToolCallsFromText(answer, { knownTools: entries.map((e) => e.name) });
    expect(summary(calls)).toEqual([{ name: "fs.read_file", args: { path: "a.txt" } }]);
  });
});
