import { readdir } from "node:fs/promises";
import { extname, join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import type { ToolModule } from "@toolmesh/tool-host";
import { ToolModuleSchema } from "@toolmesh/tool-host";
import { issuesLine } from "@toolmesh/protocol";
import type { LoadLog, ToolSourceKind } from "./tool-source.js";

/** A tool module and the file it came from. */
export interface LoadedTool {
  module: ToolModule;
  file: string;
}

const MODULE_EXTENSIONS = new Set([".js", ".mjs"]);

/** Thrown when a tools folder holds a module that is not a valid tool. */
export class ToolLoadError extends Error {
  override readonly name = "ToolLoadError";
}

/**
 * Loads every `.js`/`.mjs` module of a folder (not recursive), in file-name order. Each
 * must default-export a tool (or an array of tools). A repeated name keeps the first and
 * warns (README.md#writing-a-tool). A module that is not a valid tool fails the load, naming the file.
 */
export async function loadToolsDir(dir: string, log: LoadLog): Promise<LoadedTool[]> {
  const root = resolve(dir);
  let entries: string[];
  try {
    entries = (await readdir(root)).filter((f) => MODULE_EXTENSIONS.has(extname(f))).sort();
  } catch (err) {
    throw new ToolLoadError(`cannot read tools folder ${root}: ${(err as Error).message}`, {
      cause: err,
    });
  }
  const loaded: LoadedTool[] = [];
  const seen = new Map<string, string>();
  for (const entry of entries) {
    const file = join(root, entry);
    let exported: unknown;
    try {
      exported = ((await import(pathToFileURL(file).href)) as { default?: unknown }).default;
    } catch (err) {
      throw new ToolLoadError(`cannot import tool module ${file}: ${(err as Error).message}`, {
        cause: err,
      });
    }
    for (const candidate of Array.isArray(exported) ? exported : [exported]) {
      const parsed = ToolModuleSchema.safeParse(candidate);
      if (!parsed.success) {
        throw new ToolLoadError(
          `${file} does not default-export a tool: ${issuesLine(parsed.error)}`,
        );
      }
      const module = candidate as ToolModule;
      const first = seen.get(module.name);
      if (first !== undefined) {
        log.warn(
          { tool: module.name, kept: first, skipped: file },
          "duplicate tool name; the first one wins",
        );
        continue;
      }
      seen.set(module.name, file);
      loaded.push({ module, file });
    }
  }
  return loaded;
}

/** Builtin tools: the modules of `TOOLMESH_TOOLS_DIR`, one source for the folder. */
export const builtinToolSources: ToolSourceKind = {
  kind: "builtin",
  discover: (settings, log) =>
    Promise.resolve([
      {
        origin: resolve(settings.toolsDir),
        load: async () => (await loadToolsDir(settings.toolsDir, log)).map((t) => t.module),
      },
    ]),
};
