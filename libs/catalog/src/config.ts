import { readFile, readdir } from "node:fs/promises";
import { join, relative } from "node:path";
import { parse as parseYaml } from "yaml";
import { z } from "zod";
import type { OutputStrategyConfig } from "@toolmesh/protocol";
import { issuesLine, MAX_TOOL_NAME_LENGTH, OutputStrategyConfigSchema } from "@toolmesh/protocol";
import { CatalogConfigError, CatalogConfigProblem } from "./errors.js";

const Name = z.string().trim().min(1).max(MAX_TOOL_NAME_LENGTH);

/** A tool set file, `configs/tool_sets/<any>.yaml` (README.md#tool-groups-tool-sets-agents-and-schema-expansion). Unknown keys are refused. */
export const ToolSetConfigSchema = z.strictObject({
  name: Name,
  description: z.string().default(""),
  tools: z.array(Name).default([]),
});

/** A tool set as written in its file. */
export type ToolSetConfig = z.infer<typeof ToolSetConfigSchema>;

/** A tool set as loaded: repeated tools dropped, and the file it came from. */
export interface ToolSetProfile extends ToolSetConfig {
  /** The file it was read from, relative to the configuration folder. */
  readonly file: string;
}

/**
 * An agent file, `configs/agents/<any>.yaml`: which tool sets and single tools it may use, and
 * its output strategy. Other keys (the frontend's own settings: model, prompt, …) are allowed
 * and reported as warnings, since toolmesh does not read them.
 */
export const AgentConfigSchema = z.looseObject({
  name: Name,
  description: z.string().default(""),
  tool_sets: z.array(Name).default([]),
  tools: z.array(Name).default([]),
  output_strategy: OutputStrategyConfigSchema.optional(),
});

/** An agent as written in its file. */
export type AgentConfig = z.infer<typeof AgentConfigSchema>;

const AGENT_KEYS = new Set(["name", "description", "tool_sets", "tools", "output_strategy"]);

/** An agent with its tool sets merged into one list of tools. */
export interface AgentProfile {
  readonly name: string;
  readonly description: string;
  /** The file it was read from, relative to the configuration folder. */
  readonly file: string;
  /** The tool sets it references, in file order. */
  readonly toolSets: readonly string[];
  /**
   * Every tool it may use: the tools of its sets in order, then its own `tools`; each name
   * once, where it first appeared.
   */
  readonly tools: readonly string[];
  /** `tools` as a set, for membership checks. */
  readonly allowed: ReadonlySet<string>;
  readonly outputStrategy: OutputStrategyConfig | undefined;
}

/** Something in the configuration that works but deserves a look. */
export interface ConfigWarning {
  code: "duplicate_tool" | "ignored_key" | "no_config_dir";
  message: string;
  file?: string;
  agent?: string;
  tool?: string;
}

/** The tool sets and agents of one configuration folder, validated and merged. */
export interface CatalogConfig {
  /** The folder read; `undefined` for a configuration built in memory. */
  readonly dir: string | undefined;
  readonly toolSets: ReadonlyMap<string, ToolSetProfile>;
  readonly agents: ReadonlyMap<string, AgentProfile>;
  /** Duplicates dropped (first kept), keys ignored, folder missing. */
  readonly warnings: readonly ConfigWarning[];
}

/** One configuration file's parsed YAML, named by its path relative to the folder. */
export interface ConfigSource {
  file: string;
  data: unknown;
}

/** A configuration with no tool sets and no agents: every tool is open to every session. */
export const EMPTY_CATALOG_CONFIG: CatalogConfig = Object.freeze({
  dir: undefined,
  toolSets: new Map<string, ToolSetProfile>(),
  agents: new Map<string, AgentProfile>(),
  warnings: [],
});

/**
 * Validates tool sets and agents and merges each agent's tools (pure; {@link loadCatalogConfig}
 * reads the files). Within an agent a tool named twice — by two sets, or by a set and `tools` —
 * is kept where it first appeared and the repeat is reported as a `duplicate_tool` warning.
 *
 * @throws CatalogConfigError `invalid_file` for a file of the wrong shape, `duplicate_name`
 *   when two files define the same set or agent, `missing_tool_set` when an agent references a
 *   set no file defines.
 */
export function buildCatalogConfig(
  sources: { toolSets: readonly ConfigSource[]; agents: readonly ConfigSource[] },
  dir?: string,
  warnings: ConfigWarning[] = [],
): CatalogConfig {
  const toolSets = new Map<string, ToolSetProfile>();
  for (const source of sources.toolSets) {
    const set = parseSource(ToolSetConfigSchema, source, "tool set");
    const earlier = toolSets.get(set.name);
    if (earlier !== undefined) {
      throw new CatalogConfigError(
        CatalogConfigProblem.DuplicateName,
        `tool set "${set.name}" is defined twice: in ${earlier.file} and in ${source.file}; rename one`,
        { file: source.file },
      );
    }
    const tools = dedupe(set.tools, (tool) => {
      warnings.push({
        code: "duplicate_tool",
        file: source.file,
        tool,
        message: `tool set "${set.name}" (${source.file}) lists tool "${tool}" twice; the repeat is ignored`,
      });
    });
    toolSets.set(set.name, { ...set, tools, file: source.file });
  }

  const agents = new Map<string, AgentProfile>();
  for (const source of sources.agents) {
    const agent = parseSource(AgentConfigSchema, source, "agent");
    const earlier = agents.get(agent.name);
    if (earlier !== undefined) {
      throw new CatalogConfigError(
        CatalogConfigProblem.DuplicateName,
        `agent "${agent.name}" is defined twice: in ${earlier.file} and in ${source.file}; rename one`,
        { file: source.file },
      );
    }
    for (const key of Object.keys(agent)) {
      if (AGENT_KEYS.has(key)) continue;
      warnings.push({
        code: "ignored_key",
        file: source.file,
        agent: agent.name,
        message: `agent "${agent.name}" (${source.file}): key "${key}" is not used by toolmesh`,
      });
    }
    agents.set(agent.name, mergeAgent(agent, source.file, toolSets, warnings));
  }

  return { dir, toolSets, agents, warnings };
}

function mergeAgent(
  agent: AgentConfig,
  file: string,
  toolSets: ReadonlyMap<string, ToolSetProfile>,
  warnings: ConfigWarning[],
): AgentProfile {
  const origin = new Map<string, string>();
  const tools: string[] = [];
  const add = (tool: string, from: string): void => {
    const first = origin.get(tool);
    if (first !== undefined) {
      warnings.push({
        code: "duplicate_tool",
        file,
        agent: agent.name,
        tool,
        message:
          `agent "${agent.name}" (${file}) gets tool "${tool}" from ${first} and again from ` +
          `${from}; keeping the first`,
      });
      return;
    }
    origin.set(tool, from);
    tools.push(tool);
  };
  for (const setName of agent.tool_sets) {
    const set = toolSets.get(setName);
    if (set === undefined) {
      const defined = [...toolSets.keys()].sort();
      throw new CatalogConfigError(
        CatalogConfigProblem.MissingToolSet,
        `agent "${agent.name}" (${file}) references tool set "${setName}", which no file in ` +
          `tool_sets/ defines (${defined.length === 0 ? "none are defined" : `defined: ${defined.join(", ")}`})`,
        { file },
      );
    }
    for (const tool of set.tools) add(tool, `tool set "${setName}"`);
  }
  for (const tool of agent.tools) add(tool, "its own tools");
  return Object.freeze({
    name: agent.name,
    description: agent.description,
    file,
    toolSets: [...agent.tool_sets],
    tools,
    allowed: new Set(tools),
    outputStrategy: agent.output_strategy,
  });
}

function parseSource<T>(schema: z.ZodType<T>, source: ConfigSource, what: string): T {
  const parsed = schema.safeParse(source.data);
  if (parsed.success) return parsed.data;
  throw new CatalogConfigError(
    CatalogConfigProblem.InvalidFile,
    `${source.file} is not a valid ${what}: ${issuesLine(parsed.error)}`,
    { file: source.file, cause: parsed.error },
  );
}

function dedupe(names: readonly string[], onRepeat: (name: string) => void): string[] {
  const seen = new Set<string>();
  const out: string[] = [];
  for (const name of names) {
    if (seen.has(name)) onRepeat(name);
    else {
      seen.add(name);
      out.push(name);
    }
  }
  return out;
}

/** Options of {@link loadCatalogConfig}. */
export interface LoadCatalogConfigOptions {
  /**
   * The registry's tool names. When given, a tool set or agent naming any other tool is a load
   * error (`unknown_tool`). Services leave it out, because executors register their tools after
   * the services start; they report such names with {@link unknownToolReferences} instead.
   */
  knownTools?: Iterable<string>;
}

/**
 * Reads `<dir>/tool_sets/*.yaml` and `<dir>/agents/*.yaml` (also `.yml`, in file-name order)
 * and builds the configuration (see {@link buildCatalogConfig}). A missing folder is an empty
 * configuration (with a `no_config_dir` warning when `dir` itself is missing).
 *
 * @throws CatalogConfigError as {@link buildCatalogConfig}; `invalid_file` also for YAML that
 *   does not parse; `unknown_tool` with `knownTools`, listing every unknown reference.
 */
export async function loadCatalogConfig(
  dir: string,
  options: LoadCatalogConfigOptions = {},
): Promise<CatalogConfig> {
  const [toolSets, agents] = await Promise.all([
    readYamlFolder(dir, "tool_sets"),
    readYamlFolder(dir, "agents"),
  ]);
  const warnings: ConfigWarning[] = [];
  if (toolSets === undefined && agents === undefined && !(await exists(dir))) {
    warnings.push({
      code: "no_config_dir",
      message: `configuration folder ${dir} does not exist: no tool sets and no agents`,
    });
  }
  const config = buildCatalogConfig(
    { toolSets: toolSets ?? [], agents: agents ?? [] },
    dir,
    warnings,
  );
  if (options.knownTools !== undefined) {
    const unknown = unknownToolReferences(config, options.knownTools);
    if (unknown.length > 0) {
      throw new CatalogConfigError(
        CatalogConfigProblem.UnknownTool,
        `the configuration names tools that are not registered: ${unknown
          .map((u) => `"${u.tool}" (${u.where})`)
          .join(", ")}`,
        { file: unknown[0]?.file },
      );
    }
  }
  return config;
}

/** One name in the configuration that is not a registered tool. */
export interface UnknownToolReference {
  tool: string;
  /** `agent "x"` or `tool set "y"`. */
  where: string;
  file: string;
}

/** Names in tool sets and agents that are not among `known` (registered tools), in file order. */
export function unknownToolReferences(
  config: CatalogConfig,
  known: Iterable<string>,
): UnknownToolReference[] {
  const names = known instanceof Set ? (known as ReadonlySet<string>) : new Set(known);
  const out: UnknownToolReference[] = [];
  const reported = new Set<string>();
  for (const agent of config.agents.values()) {
    for (const tool of agent.tools) {
      if (names.has(tool) || reported.has(tool)) continue;
      reported.add(tool);
      out.push({ tool, where: `agent "${agent.name}"`, file: agent.file });
    }
  }
  for (const [name, set] of config.toolSets) {
    for (const tool of set.tools) {
      if (names.has(tool) || reported.has(tool)) continue;
      reported.add(tool);
      out.push({ tool, where: `tool set "${name}"`, file: set.file });
    }
  }
  return out;
}

async function readYamlFolder(dir: string, sub: string): Promise<ConfigSource[] | undefined> {
  const folder = join(dir, sub);
  let names: string[];
  try {
    names = await readdir(folder);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw err;
  }
  const sources: ConfigSource[] = [];
  for (const name of names.filter((n) => /\.ya?ml$/i.test(n)).sort()) {
    const path = join(folder, name);
    const file = relative(dir, path);
    let data: unknown;
    try {
      data = parseYaml(await readFile(path, "utf8"));
    } catch (err) {
      throw new CatalogConfigError(
        CatalogConfigProblem.InvalidFile,
        `${file} is not valid YAML: ${(err as Error).message}`,
        { file, cause: err },
      );
    }
    sources.push({ file, data });
  }
  return sources;
}

async function exists(path: string): Promise<boolean> {
  try {
    await readdir(path);
    return true;
  } catch {
    return false;
  }
}

/** Something that takes warnings (a pino logger fits). */
export interface ConfigWarningLog {
  warn(obj: object, msg: string): void;
}

/** Logs each configuration warning once, at `warn`, with its file, agent and tool. */
export function logConfigWarnings(config: CatalogConfig, log: ConfigWarningLog): void {
  for (const warning of config.warnings) {
    const { message, ...fields } = warning;
    log.warn(fields, message);
  }
}
