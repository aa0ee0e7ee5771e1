import type { Command } from "commander";
import { Option } from "commander";
import type { Catalog, GroupChanges } from "@toolmesh/client";
import { renderToolPrompt, toAnthropicTools, toGeminiTools, toOpenAITools } from "@toolmesh/client";
import type { GroupState } from "@toolmesh/protocol";
import type { RuntimeConfig } from "@toolmesh/runtime";
import { withClient } from "./commands.js";
import { say, typedFailure } from "./print.js";

/** Catalog output formats of `toolmesh catalog --format`. */
export const CATALOG_FORMATS = ["text", "openai", "anthropic", "gemini", "prompt"] as const;

/** One catalog output format. */
export type CatalogFormat = (typeof CATALOG_FORMATS)[number];

/** Options of `toolmesh groups …`. */
export interface GroupsCommandOptions {
  session?: string;
  json?: boolean;
}

/** Options of `toolmesh catalog`. */
export interface CatalogCommandOptions {
  session?: string;
  agent?: string;
  format?: CatalogFormat;
  json?: boolean;
}

/**
 * `toolmesh groups list|enable|disable|reset`: lists tool groups, or switches them for every
 * session of the tenant (`TOOLMESH_TENANT`), or for one session with `--session`.
 */
export async function groupsCommand(
  config: RuntimeConfig,
  changes: GroupChanges,
  options: GroupsCommandOptions,
): Promise<number> {
  return withClient(config, async (client) => {
    let groups: GroupState[];
    try {
      if (options.session === undefined) groups = await client.setGroups(changes);
      else {
        const session = client.session(options.session);
        try {
          groups = await session.setGroups(changes);
        } finally {
          session.close();
        }
      }
    } catch (err) {
      return typedFailure(err, options.json);
    }
    if (options.json === true) {
      say(JSON.stringify(groups));
      return 0;
    }
    if (groups.length === 0) {
      say("no tool groups");
      return 0;
    }
    const width = Math.max(...groups.map((g) => g.name.length));
    for (const g of groups) {
      const state = `${g.active ? "active" : "inactive"} (${g.source})`;
      say(`${g.name.padEnd(width)}  ${state.padEnd(19)}  ${g.tools.join(", ")}`);
    }
    return 0;
  });
}

/**
 * `toolmesh catalog`: the compact catalog of the tenant, a session (`--session`) or an agent
 * (`--agent`), as text, as a provider's native tool declarations, or as the structured-output
 * prompt. Tools the agent lists that are not registered are named on stderr.
 */
export async function catalogCommand(
  config: RuntimeConfig,
  options: CatalogCommandOptions,
): Promise<number> {
  return withClient(config, async (client) => {
    let catalog: Catalog;
    const agent = options.agent === undefined ? {} : { agent: options.agent };
    try {
      if (options.session === undefined) catalog = await client.catalog(agent);
      else {
        const session = client.session(options.session);
        try {
          catalog = await session.catalog(agent);
        } finally {
          session.close();
        }
      }
    } catch (err) {
      return typedFailure(err, options.json);
    }
    if (catalog.unavailable.length > 0) {
      process.stderr.write(
        `not registered (listed by agent ${catalog.agent ?? ""}): ${catalog.unavailable.join(", ")}\n`,
      );
    }
    say(
      options.json === true
        ? JSON.stringify(catalog)
        : renderCatalog(catalog, options.format ?? "text"),
    );
    return 0;
  });
}

/** The catalog in one of {@link CATALOG_FORMATS}. */
export function renderCatalog(catalog: Catalog, format: CatalogFormat): string {
  switch (format) {
    case "openai":
      return JSON.stringify(toOpenAITools(catalog.tools).tools, null, 2);
    case "anthropic":
      return JSON.stringify(toAnthropicTools(catalog.tools).tools, null, 2);
    case "gemini":
      return JSON.stringify(toGeminiTools(catalog.tools).tools, null, 2);
    case "prompt":
      return renderToolPrompt(catalog.tools);
    case "text": {
      if (catalog.tools.length === 0) return "no tools";
      const width = Math.max(...catalog.tools.map((t) => t.name.length));
      return catalog.tools
        .map(
          (t) =>
            `${t.name.padEnd(width)}  ${t.summary}${t.parameters === undefined ? "" : "  [schema sent]"}`,
        )
        .join("\n");
    }
  }
}

/**
 * Adds `groups list|enable|disable|reset` and `catalog` to the program. `config` builds the
 * configuration from the global options; `run` receives each command's exit code.
 */
export function addCatalogCommands(
  program: Command,
  config: () => RuntimeConfig,
  run: (command: () => Promise<number>) => void,
): void {
  const groups = program
    .command("groups")
    .description("list tool groups, or switch them for the tenant or one session");
  const scoped = (cmd: Command): Command =>
    cmd
      .option("--session <id>", "only this session (default: every session of the tenant)")
      .option("--json", "print JSON");
  scoped(groups.command("list").description("every group and whether it is active")).action(
    (o: GroupsCommandOptions) => run(() => groupsCommand(config(), {}, o)),
  );
  for (const [name, what] of [
    ["enable", "switch groups on"],
    ["disable", "switch groups off: their tools can no longer be called"],
    ["reset", "drop the switch at this scope (the tenant's, or active, applies)"],
  ] as const) {
    scoped(groups.command(name).description(what).argument("<group...>")).action(
      (names: string[], o: GroupsCommandOptions) =>
        run(() => groupsCommand(config(), { [name]: names }, o)),
    );
  }

  program
    .command("catalog")
    .description("print the compact tool catalog of the tenant, a session or an agent")
    .option("--session <id>", "as this session sees it (its groups and agent; schemas it has)")
    .option("--agent <name>", "only this agent's tools")
    .addOption(
      new Option(
        "--format <format>",
        "text (default), a provider's tools, or the fallback prompt",
      ).choices(CATALOG_FORMATS),
    )
    .option("--json", "print the catalog reply as JSON (groups, revisions, unavailable tools)")
    .action((o: CatalogCommandOptions) => run(() => catalogCommand(config(), o)));
}
