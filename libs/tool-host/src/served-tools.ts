import { Defaults } from "@toolmesh/protocol";
import type { Executor } from "./executor.js";
import type { ToolModule } from "./tool-module.js";

/** Something that hears about tools that could not be registered or removed (a pino logger fits). */
export interface SyncLog {
  warn(obj: object, msg: string): void;
}

/** What one {@link ServedTools.apply} changed. */
export interface ToolSync {
  added: string[];
  removed: string[];
}

/**
 * The tools one source serves through an executor, kept equal to the source's latest list:
 * each {@link apply} registers new and changed tools (an unchanged one is not registered
 * again) and removes the ones no longer listed. This is how a source that can change (a
 * `ToolSource` with `watch`, such as an MCP server) is followed.
 */
export class ServedTools {
  readonly #executor: Executor;
  readonly #log: SyncLog;
  readonly #removeGraceMs: number;
  /** Name → fingerprint of the definition registered. */
  readonly #registered = new Map<string, string>();
  readonly #removals = new Set<Promise<void>>();

  /** `removeGraceMs`: how long a removed tool's running calls may take, in ms. Default 10 000. */
  constructor(executor: Executor, log: SyncLog, removeGraceMs: number = Defaults.shutdownGraceMs) {
    this.#executor = executor;
    this.#log = log;
    this.#removeGraceMs = removeGraceMs;
  }

  /** Names served now. */
  names(): string[] {
    return [...this.#registered.keys()];
  }

  /** Whether `name` is served now. */
  has(name: string): boolean {
    return this.#registered.has(name);
  }

  /**
   * Makes the served tools the given list. A tool the registry refuses (another owner's name)
   * is left out; one that cannot be registered is logged and left out. Removals are not
   * awaited: running calls of a removed tool may finish ({@link settled} waits for them).
   */
  async apply(modules: readonly ToolModule[]): Promise<ToolSync> {
    const next = new Map(modules.map((m) => [m.name, m]));
    const added: string[] = [];
    for (const [name, module] of next) {
      const fingerprint = fingerprintOf(module);
      if (this.#registered.get(name) === fingerprint) continue;
      try {
        if (await this.#executor.addTool(module)) {
          this.#registered.set(name, fingerprint);
          added.push(name);
        }
      } catch (err) {
        this.#log.warn(
          { tool: name, err: err instanceof Error ? err.message : String(err) },
          "cannot register tool; skipped",
        );
      }
    }
    const removed = [...this.#registered.keys()].filter((name) => !next.has(name));
    for (const name of removed) {
      this.#registered.delete(name);
      const removal = this.#executor
        .removeTool(name, this.#removeGraceMs)
        .catch((err: unknown) => this.#log.warn({ err, tool: name }, "cannot remove tool"))
        .finally(() => this.#removals.delete(removal));
      this.#removals.add(removal);
    }
    return { added, removed };
  }

  /** Resolves once the removals started so far have finished. */
  async settled(): Promise<void> {
    await Promise.all(this.#removals);
  }
}

/** What a registration depends on, to skip re-registering an unchanged tool. */
function fingerprintOf(module: ToolModule): string {
  return JSON.stringify([module.description, module.parameters, module.annotations]);
}
