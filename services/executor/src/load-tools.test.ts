import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it, vi } from "vitest";
import type { Mock } from "vitest";
import { z } from "zod";
import { ToolLoadError, loadToolsDir } from "./load-tools.js";
import type { LoadLog } from "./tool-source.js";
import { ToolModuleSchema, defineTool } from "@toolmesh/tool-host";
import type { ToolContext } from "@toolmesh/tool-host";

const dirs: string[] = [];

afterAll(async () => {
  await Promise.all(dirs.map((dir) => rm(dir, { recursive: true, force: true })));
});

/** A fresh folder holding `files` (name → source). Fresh paths also defeat the import cache. */
async function toolsDir(files: Record<string, string>): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "toolmesh-load-tools-"));
  dirs.push(dir);
  for (const [name, source] of Object.entries(files)) {
    await mkdir(join(dir, name, ".."), { recursive: true });
    await writeFile(join(dir, name), source);
  }
  return dir;
}

/** Source of a module default-exporting one plain-object tool. */
function toolSource(name: string, extra = ""): string {
  return `export default {
  name: ${JSON.stringify(name)},
  description: "The ${name} tool.",
  parameters: { type: "object", properties: { x: { type: "string" } } },
  ${extra}
  handler: (args) => ({ tool: ${JSON.stringify(name)}, args }),
};
`;
}

function fakeLog(): LoadLog & { warn: Mock<(obj: object, msg: string) => void> } {
  return { warn: vi.fn<(obj: object, msg: string) => void>() };
}

async function loadError(dir: string): Promise<ToolLoadError> {
  const log = fakeLog();
  const err: unknown = await loadToolsDir(dir, log).then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(ToolLoadError);
  return err as ToolLoadError;
}

const ctx = {} as ToolContext;

describe("loadToolsDir", () => {
  it("loads a plain object default export", async () => {
    const dir = await toolsDir({ "echo.mjs": toolSource("echo", "groups: ['text'],") });
    const log = fakeLog();
    const loaded = await loadToolsDir(dir, log);
    expect(loaded).toHaveLength(1);
    expect(loaded[0]?.file).toBe(join(dir, "echo.mjs"));
    expect(loaded[0]?.module.name).toBe("echo");
    expect(loaded[0]?.module.groups).toEqual(["text"]);
    expect(await loaded[0]?.module.handler({ x: "1" }, ctx)).toEqual({
      tool: "echo",
      args: { x: "1" },
    });
    expect(log.warn).not.toHaveBeenCalled();
  });

  it("loads every tool of a module exporting an array, in order", async () => {
    const dir = await toolsDir({
      "many.mjs": `export default [
        { name: "one", description: "", parameters: {}, handler: () => 1 },
        { name: "two", description: "", parameters: {}, handler: async () => 2 },
        { name: "three", description: "", parameters: {}, handler: () => 3 },
      ];`,
    });
    const loaded = await loadToolsDir(dir, fakeLog());
    expect(loaded.map((t) => t.module.name)).toEqual(["one", "two", "three"]);
    expect(new Set(loaded.map((t) => t.file))).toEqual(new Set([join(dir, "many.mjs")]));
  });

  it("loads files in file-name order, not creation order", async () => {
    const dir = await toolsDir({
      "c.mjs": toolSource("gamma"),
      "a.mjs": toolSource("alpha"),
      "b.mjs": toolSource("beta"),
    });
    const loaded = await loadToolsDir(dir, fakeLog());
    expect(loaded.map((t) => t.module.name)).toEqual(["alpha", "beta", "gamma"]);
  });

  it("keeps the first of duplicate names across files and warns naming both files", async () => {
    const dir = await toolsDir({
      "b-second.mjs": toolSource("dup", "summary: 'from b',"),
      "a-first.mjs": toolSource("dup", "summary: 'from a',"),
      "c-other.mjs": toolSource("other"),
    });
    const log = fakeLog();
    const loaded = await loadToolsDir(dir, log);
    expect(loaded.map((t) => t.module.name)).toEqual(["dup", "other"]);
    expect(loaded[0]?.module.summary).toBe("from a");
    expect(loaded[0]?.file).toBe(join(dir, "a-first.mjs"));
    expect(log.warn).toHaveBeenCalledTimes(1);
    const [obj, msg] = log.warn.mock.calls[0] as [Record<string, unknown>, string];
    expect(obj).toMatchObject({
      tool: "dup",
      kept: join(dir, "a-first.mjs"),
      skipped: join(dir, "b-second.mjs"),
    });
    expect(msg).toMatch(/duplicate/i);
  });

  it("keeps the first of duplicate names within one module and warns", async () => {
    const dir = await toolsDir({
      "pair.mjs": `export default [
        { name: "same", description: "first", parameters: {}, handler: () => 1 },
        { name: "same", description: "second", parameters: {}, handler: () => 2 },
      ];`,
    });
    const log = fakeLog();
    const loaded = await loadToolsDir(dir, log);
    expect(loaded.map((t) => t.module.description)).toEqual(["first"]);
    expect(log.warn).toHaveBeenCalledTimes(1);
  });

  it.each([
    ["lacks a handler", `export default { name: "t", description: "", parameters: {} };`],
    [
      "has a handler that is not a function",
      `export default { name: "t", description: "", parameters: {}, handler: "run" };`,
    ],
    [
      "has an empty name",
      `export default { name: "", description: "", parameters: {}, handler: () => 1 };`,
    ],
    [
      "has a name over 128 characters",
      `export default { name: ${JSON.stringify("n".repeat(129))}, description: "", parameters: {}, handler: () => 1 };`,
    ],
    [
      "has a numeric name",
      `export default { name: 7, description: "", parameters: {}, handler: () => 1 };`,
    ],
    [
      "has no default export",
      `export const tool = { name: "t", description: "", parameters: {}, handler: () => 1 };`,
    ],
    ["default-exports null", `export default null;`],
    [
      "holds an invalid tool in an array",
      `export default [
        { name: "ok", description: "", parameters: {}, handler: () => 1 },
        { name: "broken", description: "", parameters: {} },
      ];`,
    ],
  ])(
    "fails with ToolLoadError naming the file when the default export %s",
    async (_label, source) => {
      const dir = await toolsDir({ "a-good.mjs": toolSource("good"), "bad-tool.mjs": source });
      const err = await loadError(dir);
      expect(err.name).toBe("ToolLoadError");
      expect(err.message).toContain(join(dir, "bad-tool.mjs"));
    },
  );

  it("says every problem of an invalid tool on one line, each at its field", async () => {
    const dir = await toolsDir({
      "bad.mjs": `export default { name: "t", description: 3, handler: () => 1 };`,
    });
    const err = await loadError(dir);
    expect(err.message).toBe(
      `${join(dir, "bad.mjs")} does not default-export a tool: description: Invalid input: expected string, received number; parameters: Invalid input: expected record, received undefined`,
    );
  });

  it("fails with ToolLoadError naming the file when the module throws at import", async () => {
    const dir = await toolsDir({
      "explodes.mjs": `throw new Error("kaboom at import");\nexport default {};`,
    });
    const err = await loadError(dir);
    expect(err.message).toContain(join(dir, "explodes.mjs"));
    expect(err.message).toContain("kaboom at import");
    expect((err.cause as Error).message).toBe("kaboom at import");
  });

  it("fails with ToolLoadError naming the file when the module does not parse", async () => {
    const dir = await toolsDir({ "syntax.mjs": `export default {` });
    const err = await loadError(dir);
    expect(err.message).toContain(join(dir, "syntax.mjs"));
  });

  it("ignores files that are not .js/.mjs modules and does not recurse", async () => {
    const dir = await toolsDir({
      "tool.mjs": toolSource("real"),
      "README.md": "# not a tool",
      "data.json": '{"name":"nope"}',
      "types.ts": "export default 1 as number;",
      "notes.txt": "throw new Error('should not run')",
      "broken.mjs.bak": "this is not javascript",
      "nested/inner.mjs": toolSource("nested"),
    });
    const log = fakeLog();
    const loaded = await loadToolsDir(dir, log);
    expect(loaded.map((t) => t.module.name)).toEqual(["real"]);
    expect(log.warn).not.toHaveBeenCalled();
  });

  it("gives no tools for an empty folder", async () => {
    const dir = await toolsDir({});
    expect(await loadToolsDir(dir, fakeLog())).toEqual([]);
  });

  it("fails with ToolLoadError naming a missing folder", async () => {
    const dir = join(await toolsDir({}), "does-not-exist");
    const err = await loadError(dir);
    expect(err.message).toContain(dir);
  });

  it("fails with ToolLoadError when the path is a file", async () => {
    const dir = await toolsDir({ "file.mjs": toolSource("x") });
    const err = await loadError(join(dir, "file.mjs"));
    expect(err.message).toContain(join(dir, "file.mjs"));
  });
});

describe("defineTool", () => {
  const input = z.object({
    query: z.string().describe("What to look for"),
    limit: z.number().int().min(1).default(10).describe("Most hits to return"),
    lang: z.enum(["en", "de"]).optional(),
  });

  function searchTool(handler = vi.fn((args: z.output<typeof input>, _ctx: ToolContext) => args)) {
    return {
      handler,
      tool: defineTool({
        name: "search",
        description: "Searches. Fast.",
        groups: ["web"],
        timeoutMs: 1_000,
        input,
        handler,
      }),
    };
  }

  it("generates the JSON Schema from zod: required, defaults, descriptions, no $schema", () => {
    const { tool } = searchTool();
    const params = tool.parameters as {
      type: string;
      properties: Record<string, Record<string, unknown>>;
      required?: string[];
    };
    expect("$schema" in tool.parameters).toBe(false);
    expect(params.type).toBe("object");
    expect(params.required).toEqual(["query"]);
    expect(params.properties.query).toMatchObject({
      type: "string",
      description: "What to look for",
    });
    expect(params.properties.limit).toMatchObject({
      type: "integer",
      default: 10,
      description: "Most hits to return",
    });
    expect(params.properties.lang).toMatchObject({ enum: ["en", "de"] });
    expect(Object.keys(params.properties).sort()).toEqual(["lang", "limit", "query"]);
  });

  it("keeps the other module fields and passes the shape check of loaded modules", () => {
    const { tool } = searchTool();
    expect(tool.name).toBe("search");
    expect(tool.description).toBe("Searches. Fast.");
    expect(tool.groups).toEqual(["web"]);
    expect(tool.timeoutMs).toBe(1_000);
    expect("input" in tool).toBe(false);
    expect(ToolModuleSchema.safeParse(tool).success).toBe(true);
  });

  it("hands the handler zod-parsed arguments with defaults applied, and the context", async () => {
    const { tool, handler } = searchTool();
    const context = { callId: "c1" } as ToolContext;
    const result = await tool.handler({ query: "cats" }, context);
    expect(handler).toHaveBeenCalledTimes(1);
    expect(handler.mock.calls[0]?.[0]).toEqual({ query: "cats", limit: 10 });
    expect(handler.mock.calls[0]?.[1]).toBe(context);
    expect(result).toEqual({ query: "cats", limit: 10 });
  });

  it("throws a terminal invalid_parameters and never calls the handler when zod rejects the arguments", () => {
    const { tool, handler } = searchTool();
    expect(() => tool.handler({ limit: 5 }, ctx)).toThrow(
      expect.objectContaining({ code: "invalid_parameters", retryable: false }),
    );
    expect(() => tool.handler({ query: "x", limit: 0 }, ctx)).toThrow();
    expect(() => tool.handler({ query: "x", lang: "fr" }, ctx)).toThrow();
    expect(handler).not.toHaveBeenCalled();
  });
});
