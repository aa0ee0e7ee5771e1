import { mkdtemp, mkdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import {
  buildCatalogConfig,
  loadCatalogConfig,
  logConfigWarnings,
  unknownToolReferences,
} from "./config.js";
import type { ConfigSource } from "./config.js";
import { CatalogConfigError, CatalogConfigProblem } from "./errors.js";

const set = (name: string, tools: string[], file = `tool_sets/${name}.yaml`): ConfigSource => ({
  file,
  data: { name, tools },
});
const agent = (data: Record<string, unknown>, file?: string): ConfigSource => ({
  file: file ?? `agents/${String(data.name)}.yaml`,
  data,
});

function expectProblem(fn: () => unknown, problem: CatalogConfigProblem, text: RegExp): void {
  let thrown: unknown;
  try {
    fn();
  } catch (err) {
    thrown = err;
  }
  expect(thrown).toBeInstanceOf(CatalogConfigError);
  expect((thrown as CatalogConfigError).problem).toBe(problem);
  expect((thrown as CatalogConfigError).message).toMatch(text);
  expect((thrown as CatalogConfigError).retryable).toBe(false);
}

describe("buildCatalogConfig", () => {
  it("merges an agent's tool sets in order, then its own tools", () => {
    const config = buildCatalogConfig({
      toolSets: [set("data", ["sql_tool", "excel_tool", "plot_tool"]), set("web", ["search"])],
      agents: [agent({ name: "analyst", tool_sets: ["web", "data"], tools: ["calculator"] })],
    });
    const analyst = config.agents.get("analyst");
    expect(analyst?.tools).toEqual(["search", "sql_tool", "excel_tool", "plot_tool", "calculator"]);
    expect(analyst?.allowed.has("plot_tool")).toBe(true);
    expect(analyst?.toolSets).toEqual(["web", "data"]);
    expect(analyst?.file).toBe("agents/analyst.yaml");
    expect(config.warnings).toEqual([]);
  });

  it("keeps the first of a tool named twice and warns, naming both places", () => {
    const config = buildCatalogConfig({
      toolSets: [set("a", ["x", "y"]), set("b", ["y", "z"])],
      agents: [agent({ name: "dup", tool_sets: ["a", "b"], tools: ["z", "w"] })],
    });
    expect(config.agents.get("dup")?.tools).toEqual(["x", "y", "z", "w"]);
    expect(config.warnings.map((w) => [w.code, w.agent, w.tool])).toEqual([
      ["duplicate_tool", "dup", "y"],
      ["duplicate_tool", "dup", "z"],
    ]);
    expect(config.warnings[0]?.message).toBe(
      'agent "dup" (agents/dup.yaml) gets tool "y" from tool set "a" and again from tool set "b"; keeping the first',
    );
    expect(config.warnings[1]?.message).toContain('from tool set "b" and again from its own tools');
  });

  it("warns about a tool listed twice inside one set and keeps it once", () => {
    const config = buildCatalogConfig({
      toolSets: [set("s", ["a", "b", "a"])],
      agents: [agent({ name: "x", tool_sets: ["s"] })],
    });
    expect(config.toolSets.get("s")?.tools).toEqual(["a", "b"]);
    expect(config.agents.get("x")?.tools).toEqual(["a", "b"]);
    expect(config.warnings).toHaveLength(1);
    expect(config.warnings[0]).toMatchObject({ code: "duplicate_tool", tool: "a" });
  });

  it("refuses a reference to a tool set no file defines, saying which exist", () => {
    expectProblem(
      () =>
        buildCatalogConfig({
          toolSets: [set("data", ["sql"]), set("web", ["search"])],
          agents: [agent({ name: "analyst", tool_sets: ["data", "reports"] })],
        }),
      CatalogConfigProblem.MissingToolSet,
      /^agent "analyst" \(agents\/analyst\.yaml\) references tool set "reports", which no file in tool_sets\/ defines \(defined: data, web\)$/,
    );
    expectProblem(
      () => buildCatalogConfig({ toolSets: [], agents: [agent({ name: "a", tool_sets: ["x"] })] }),
      CatalogConfigProblem.MissingToolSet,
      /none are defined/,
    );
  });

  it("refuses two files defining the same set or agent", () => {
    expectProblem(
      () =>
        buildCatalogConfig({
          toolSets: [set("s", []), set("s", [], "tool_sets/other.yaml")],
          agents: [],
        }),
      CatalogConfigProblem.DuplicateName,
      /tool set "s" is defined twice: in tool_sets\/s\.yaml and in tool_sets\/other\.yaml/,
    );
    expectProblem(
      () =>
        buildCatalogConfig({
          toolSets: [],
          agents: [agent({ name: "a" }), agent({ name: "a" }, "agents/b.yaml")],
        }),
      CatalogConfigProblem.DuplicateName,
      /agent "a" is defined twice/,
    );
  });

  it("refuses files of the wrong shape, naming the file and the field", () => {
    expectProblem(
      () =>
        buildCatalogConfig({
          toolSets: [{ file: "tool_sets/x.yaml", data: { name: "x", tool: ["a"] } }],
          agents: [],
        }),
      CatalogConfigProblem.InvalidFile,
      /tool_sets\/x\.yaml is not a valid tool set: .*tool/,
    );
    expectProblem(
      () =>
        buildCatalogConfig({
          toolSets: [],
          agents: [{ file: "agents/a.yaml", data: { name: "a", tools: "echo" } }],
        }),
      CatalogConfigProblem.InvalidFile,
      /agents\/a\.yaml is not a valid agent: .*tools/,
    );
    expectProblem(
      () => buildCatalogConfig({ toolSets: [], agents: [{ file: "agents/a.yaml", data: null }] }),
      CatalogConfigProblem.InvalidFile,
      /agents\/a\.yaml/,
    );
    expectProblem(
      () => buildCatalogConfig({ toolSets: [set("", ["a"])], agents: [] }),
      CatalogConfigProblem.InvalidFile,
      /name/,
    );
  });

  it("keeps an agent's own settings but warns that toolmesh ignores them", () => {
    const config = buildCatalogConfig({
      toolSets: [],
      agents: [
        agent({
          name: "a",
          model: "gpt-x",
          output_strategy: { function_calling: false },
        }),
      ],
    });
    expect(config.agents.get("a")?.outputStrategy).toEqual({
      function_calling: false,
      fallback_to_structured_output: true,
    });
    expect(config.warnings).toEqual([expect.objectContaining({ code: "ignored_key", agent: "a" })]);
  });
});

describe("unknownToolReferences", () => {
  it("lists names that are not registered, once each, agents first", () => {
    const config = buildCatalogConfig({
      toolSets: [set("s", ["a", "ghost"]), set("unused", ["phantom"])],
      agents: [agent({ name: "x", tool_sets: ["s"], tools: ["b", "ghost"] })],
    });
    expect(unknownToolReferences(config, ["a", "b"])).toEqual([
      { tool: "ghost", where: 'agent "x"', file: "agents/x.yaml" },
      { tool: "phantom", where: 'tool set "unused"', file: "tool_sets/unused.yaml" },
    ]);
  });
});

describe("loadCatalogConfig", () => {
  const dirs: string[] = [];
  afterEach(async () => {
    await Promise.all(dirs.splice(0).map((d) => rm(d, { recursive: true, force: true })));
  });

  async function folder(files: Record<string, string>): Promise<string> {
    const dir = await mkdtemp(join(tmpdir(), "toolmesh-catalog-"));
    dirs.push(dir);
    for (const [path, text] of Object.entries(files)) {
      await mkdir(join(dir, path, ".."), { recursive: true });
      await writeFile(join(dir, path), text);
    }
    return dir;
  }

  it("reads .yaml and .yml files in name order and ignores others", async () => {
    const dir = await folder({
      "tool_sets/b.yml": "name: second\ntools: [c]\n",
      "tool_sets/a.yaml": "name: first\ndescription: 数据分析工具集\ntools: [a, b]\n",
      "tool_sets/README.md": "not yaml: [",
      "agents/analyst.yaml": "name: analyst\ntool_sets: [first, second]\ntools: [a]\n",
    });
    const config = await loadCatalogConfig(dir);
    expect([...config.toolSets.keys()]).toEqual(["first", "second"]);
    expect(config.toolSets.get("first")?.description).toBe("数据分析工具集");
    expect(config.agents.get("analyst")?.tools).toEqual(["a", "b", "c"]);
    expect(config.warnings.map((w) => w.message)).toEqual([
      'agent "analyst" (agents/analyst.yaml) gets tool "a" from tool set "first" and again from its own tools; keeping the first',
    ]);
  });

  it("names the file of YAML that does not parse", async () => {
    const dir = await folder({ "agents/bad.yaml": "name: [unclosed\n" });
    await expect(loadCatalogConfig(dir)).rejects.toMatchObject({
      name: "CatalogConfigError",
      problem: "invalid_file",
      file: "agents/bad.yaml",
    });
  });

  it("fails on a missing tool set with the agent's file", async () => {
    const dir = await folder({ "agents/x.yaml": "name: x\ntool_sets: [nope]\n" });
    await expect(loadCatalogConfig(dir)).rejects.toThrow(
      'agent "x" (agents/x.yaml) references tool set "nope", which no file in tool_sets/ defines (none are defined)',
    );
  });

  it("is empty, with a warning, when the folder does not exist", async () => {
    const config = await loadCatalogConfig(join(tmpdir(), "toolmesh-no-such-dir-4f1c"));
    expect(config.agents.size).toBe(0);
    expect(config.toolSets.size).toBe(0);
    expect(config.warnings.map((w) => w.code)).toEqual(["no_config_dir"]);
  });

  it("is empty without a warning when the folder has neither subfolder", async () => {
    const dir = await folder({ "other.txt": "x" });
    const config = await loadCatalogConfig(dir);
    expect(config.warnings).toEqual([]);
  });

  it("with the registry's names, refuses tools that are not registered", async () => {
    const dir = await folder({
      "tool_sets/s.yaml": "name: s\ntools: [echo, ghost]\n",
      "agents/x.yaml": "name: x\ntool_sets: [s]\n",
    });
    await expect(loadCatalogConfig(dir, { knownTools: ["echo", "ghost"] })).resolves.toBeDefined();
    await expect(loadCatalogConfig(dir, { knownTools: ["echo"] })).rejects.toMatchObject({
      problem: "unknown_tool",
      message: 'the configuration names tools that are not registered: "ghost" (agent "x")',
    });
  });
});

describe("logConfigWarnings", () => {
  it("logs each warning with its fields", () => {
    const lines: [object, string][] = [];
    const config = buildCatalogConfig({
      toolSets: [set("s", ["a", "a"])],
      agents: [],
    });
    logConfigWarnings(config, { warn: (obj, msg) => lines.push([obj, msg]) });
    expect(lines).toEqual([
      [
        { code: "duplicate_tool", file: "tool_sets/s.yaml", tool: "a" },
        'tool set "s" (tool_sets/s.yaml) lists tool "a" twice; the repeat is ignored',
      ],
    ]);
  });
});
