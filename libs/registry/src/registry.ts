import type { NatsConnection, QueuedIterator } from "@nats-io/nats-core";
import type { KV, KvWatchEntry } from "@nats-io/kv";
import type { JetStreamManager } from "@nats-io/jetstream";
import { jetstreamManager } from "@nats-io/jetstream";
import type { EnsureOptions } from "@toolmesh/nats";
import {
  isWrongLastSequence,
  meshPlan,
  openBucket,
  scanBucket,
  warnUnavailable,
  watchLoaded,
} from "@toolmesh/nats";
import type { ToolDefinition, ToolDefinitionInput, Subjects } from "@toolmesh/protocol";
import {
  ErrorCode,
  ToolDefinitionSchema,
  ToolmeshError,
  encodeJson,
  decodeJsonOrUndefined,
  safeToolName,
} from "@toolmesh/protocol";
import type { CompiledTool } from "./compile.js";
import { compileTool } from "./compile.js";
import type { RegistrationLimits } from "./limits.js";
import { DEFAULT_REGISTRATION_LIMITS, checkOwnerRoom, checkToolSize } from "./limits.js";

/** What happened to a registration. */
export type RegisterOutcome =
  | { status: "created" | "updated" | "unchanged"; revision: number }
  | { status: "conflict"; owner: string };

/**
 * A tool whose provider-safe name ({@link safeToolName}) is another registered tool's: models
 * could not tell the two apart, so the second is refused. `invalid_request`, not retryable;
 * details `tool`, `collides_with`, `safe_name`.
 */
export class ToolNameCollisionError extends ToolmeshError {
  constructor(tool: string, collidesWith: string, safeName: string) {
    super(
      ErrorCode.InvalidRequest,
      `tool "${tool}" cannot be registered: its provider-safe name "${safeName}" is that of the registered tool "${collidesWith}"; rename one of them`,
      { retryable: false, details: { tool, collides_with: collidesWith, safe_name: safeName } },
    );
  }
}

/** Told about registry changes seen by the watcher. */
export type RegistryListener = (change: { name: string; tool: CompiledTool | undefined }) => void;

/** Something that wants to hear about registry problems (a pino logger fits). */
export interface RegistryLog {
  warn(obj: object, msg: string): void;
}

/** Options of {@link openRegistry}. */
export interface RegistryOptions {
  subjects: Subjects;
  log: RegistryLog;
  /** Keep a live, compiled copy of every entry. Default true; registrars alone may skip it. */
  watch?: boolean;
  /** Replicas of the bucket when created or updated. Default 1. */
  replicas?: number;
  /** What to do with an existing bucket whose settings differ. Default `"update"`. */
  existing?: EnsureOptions["existing"];
  /** What one registration may hold (ADR 0049). Default {@link DEFAULT_REGISTRATION_LIMITS}. */
  limits?: Partial<RegistrationLimits>;
  /**
   * How long the watcher's first load may go without delivering an entry before another watcher
   * is started ({@link watchLoaded}). Default 15 s.
   */
  watchStallMs?: number;
}

/**
 * The tool registry: one KV entry per tool, keyed by {@link Subjects.registryKey}. Every service
 * watches it and keeps each tool compiled, so a tool registered while the mesh runs is
 * usable at once and no schema is compiled per call.
 */
export class ToolRegistry {
  readonly #kv: KV;
  readonly #jsm: JetStreamManager;
  readonly #log: RegistryLog;
  readonly #subjects: Subjects;
  readonly #tools = new Map<string, CompiledTool>();
  readonly #nameByKey = new Map<string, string>();
  readonly #listeners = new Set<RegistryListener>();
  readonly #limits: RegistrationLimits;
  #watcher: QueuedIterator<KvWatchEntry> | undefined;
  /** Provider-safe name → tool name, of the live copy. */
  readonly #bySafeName = new Map<string, string>();

  private constructor(
    kv: KV,
    jsm: JetStreamManager,
    log: RegistryLog,
    subjects: Subjects,
    limits: RegistrationLimits,
  ) {
    this.#kv = kv;
    this.#jsm = jsm;
    this.#log = log;
    this.#subjects = subjects;
    this.#limits = limits;
  }

  /** Opens (creating when needed) the bucket and, unless told not to, loads and watches it. */
  static async open(nc: NatsConnection, options: RegistryOptions): Promise<ToolRegistry> {
    const spec = meshPlan(options.subjects, { replicas: options.replicas }).buckets.registry;
    const jsm = await jetstreamManager(nc);
    const kv = await openBucket(nc, jsm, spec, { existing: options.existing ?? "update" });
    const limits = { ...DEFAULT_REGISTRATION_LIMITS, ...options.limits };
    const registry = new ToolRegistry(kv, jsm, options.log, options.subjects, limits);
    if (options.watch !== false) await registry.#startWatch(options.watchStallMs);
    return registry;
  }

  /**
   * Registers a tool. The first registration of a name wins; a later claim by another
   * owner is refused with a warning (`conflict`). The owner may publish a new definition
   * (rolling upgrades); its replicas re-registering the same definition change nothing.
   * A definition over a per-tool limit is refused with `payload_too_large`; one that would take
   * its owner over its tools or bytes with `quota_exceeded` (ADR 0049), counted on the live
   * copy: a registry opened with `watch: false` checks per tool only, and registrations racing
   * the watch may pass the count by as many as are in flight.
   *
   * @throws ToolNameCollisionError when another registered tool has the same provider-safe
   *   name. Checked against the live copy (the bucket, without a watch): two colliding names
   *   registered at the same instant can both pass, and catalogs then tell them apart by a
   *   hash suffix ({@link createNameMap}).
   */
  async register(input: ToolDefinitionInput): Promise<RegisterOutcome> {
    const definition = ToolDefinitionSchema.parse(input);
    const bytes = checkToolSize(definition, this.#limits);
    if (this.#watcher !== undefined) {
      checkOwnerRoom(definition.owner, this.#ownerSizes(definition), bytes, this.#limits);
    }
    compileTool(definition, 0); // a schema that cannot compile is refused before it is stored
    await this.#refuseSafeNameCollision(definition.name);
    const outcome = await this.#put(definition);
    // Held at once, so a colliding name registered next through this registry is refused
    // before the watcher brings the entry back.
    const safe = safeToolName(definition.name);
    if (this.#watcher !== undefined && !this.#bySafeName.has(safe)) {
      this.#bySafeName.set(safe, definition.name);
    }
    return outcome;
  }

  /** Writes a definition: first registration wins, the owner may update (see register). */
  async #put(definition: ToolDefinition): Promise<RegisterOutcome> {
    const key = this.#subjects.registryKey(definition.name);
    const data = encodeJson(definition);
    for (;;) {
      try {
        return { status: "created", revision: await this.#kv.create(key, data) };
      } catch (err) {
        if (!isWrongLastSequence(err)) throw err;
      }
      const entry = await this.#kv.get(key);
      if (entry === null || entry.operation !== "PUT") continue; // deleted meanwhile: create again
      const parsed = ToolDefinitionSchema.safeParse(decodeJsonOrUndefined(entry.value));
      // An entry of another name under this key counts for nobody (see #entryDefinition).
      if (parsed.success && parsed.data.name === definition.name) {
        const current = parsed.data;
        if (current.owner !== definition.owner) {
          this.#log.warn(
            { tool: definition.name, owner: current.owner, refused: definition.owner },
            "tool name already registered by another owner; registration refused",
          );
          return { status: "conflict", owner: current.owner };
        }
        if (JSON.stringify(current) === JSON.stringify(definition)) {
          return { status: "unchanged", revision: entry.revision };
        }
      } else {
        // Not a tool definition (written by something else): nobody owns it, so it is taken.
        this.#log.warn(
          { tool: definition.name, key },
          "replacing a registry entry that is not a definition of this tool",
        );
      }
      try {
        return { status: "updated", revision: await this.#kv.update(key, data, entry.revision) };
      } catch (err) {
        if (!isWrongLastSequence(err)) throw err;
      }
    }
  }

  /** Removes a tool; only its owner may. */
  async unregister(name: string, owner: string): Promise<boolean> {
    const key = this.#subjects.registryKey(name);
    const entry = await this.#kv.get(key);
    if (entry === null || entry.operation !== "PUT") return false;
    const current = this.#entryDefinition(key, entry.value);
    if (current === undefined || current.name !== name) return false;
    if (current.owner !== owner) {
      throw new ToolmeshError(
        ErrorCode.PermissionDenied,
        `tool "${name}" belongs to ${current.owner}`,
      );
    }
    await this.#kv.delete(key, { previousSeq: entry.revision });
    return true;
  }

  /** Encoded sizes of the other tools of `definition`'s owner, from the live copy. */
  #ownerSizes(definition: ToolDefinition): number[] {
    const sizes: number[] = [];
    for (const tool of this.#tools.values()) {
      const other = tool.definition;
      if (other.owner === definition.owner && other.name !== definition.name)
        sizes.push(encodeJson(other).length);
    }
    return sizes;
  }

  /**
   * The tool a provider-safe name ({@link safeToolName}) stands for, from the live copy: how a
   * model's call by safe name maps back to the tool. A tool's own name maps to itself.
   */
  toolOfSafeName(safeName: string): string | undefined {
    if (this.#tools.has(safeName)) return safeName;
    return this.#bySafeName.get(safeName);
  }

  async #refuseSafeNameCollision(name: string): Promise<void> {
    const safe = safeToolName(name);
    const holder =
      this.#watcher !== undefined
        ? this.#bySafeName.get(safe)
        : (await this.fetchAll()).find((d) => d.name !== name && safeToolName(d.name) === safe)
            ?.name;
    if (holder !== undefined && holder !== name) {
      throw new ToolNameCollisionError(name, holder, safe);
    }
  }

  /** The compiled tool of that name, from the live copy. */
  get(name: string): CompiledTool | undefined {
    return this.#tools.get(name);
  }

  /** Names of every registered tool. */
  names(): IterableIterator<string> {
    return this.#tools.keys();
  }

  /** Every registered tool, compiled. */
  tools(): IterableIterator<CompiledTool> {
    return this.#tools.values();
  }

  /** Reads one definition straight from the bucket (no watcher needed). */
  async fetch(name: string): Promise<ToolDefinition | undefined> {
    const key = this.#subjects.registryKey(name);
    const entry = await this.#kv.get(key);
    if (entry === null || entry.operation !== "PUT") return undefined;
    const definition = this.#entryDefinition(key, entry.value);
    return definition?.name === name ? definition : undefined;
  }

  /**
   * Reads every definition straight from the bucket (no watcher needed), by message gets
   * ({@link scanBucket}): listing keys fails on nats-server 2.9 while a node is down.
   */
  async fetchAll(): Promise<ToolDefinition[]> {
    const out: ToolDefinition[] = [];
    for (const { key, value } of await scanBucket(this.#jsm, this.#subjects.registryBucket)) {
      const definition = this.#entryDefinition(key, value);
      if (definition !== undefined) out.push(definition);
    }
    return out.sort((a, b) => a.name.localeCompare(b.name));
  }

  /** Subscribes to changes seen by the watcher; returns the unsubscribe function. */
  onChange(listener: RegistryListener): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  /**
   * Logs each tool that becomes available (with its revision and owner) or is removed, as the
   * watcher sees it; returns the way to stop.
   */
  logChanges(log: { info(obj: object, msg: string): void }): () => void {
    return this.onChange(({ name, tool }) => {
      if (tool === undefined) log.info({ tool: name }, "tool removed");
      else
        log.info(
          { tool: name, revision: tool.revision, owner: tool.definition.owner },
          "tool available",
        );
    });
  }

  /** Stops watching. */
  close(): void {
    this.#watcher?.stop();
  }

  /** Starts the watcher; resolves once it has delivered every tool stored now. */
  async #startWatch(stallMs: number | undefined): Promise<void> {
    this.#watcher = await watchLoaded(this.#kv, (entry) => this.#apply(entry), {
      what: "load the tool registry",
      ...(stallMs === undefined ? {} : { stallMs }),
      onRetry: warnUnavailable(this.#log, this.#subjects.registryBucket, "bucket"),
    });
  }

  #apply(entry: KvWatchEntry): void {
    const definition =
      entry.operation === "PUT" ? this.#entryDefinition(entry.key, entry.value) : undefined;
    const previous = this.#nameByKey.get(entry.key);
    if (definition === undefined) {
      // Deleted, or no longer a definition filed under its own key: the key holds no tool.
      if (previous !== undefined) {
        this.#nameByKey.delete(entry.key);
        this.#tools.delete(previous);
        this.#forgetSafeName(previous);
        this.#emit(previous, undefined);
      }
      return;
    }
    try {
      const tool = compileTool(definition, entry.revision);
      this.#tools.set(definition.name, tool);
      this.#nameByKey.set(entry.key, definition.name);
      // The first holder of a safe name keeps it (a collision that raced past register()).
      if (!this.#bySafeName.has(safeToolName(definition.name)))
        this.#bySafeName.set(safeToolName(definition.name), definition.name);
      this.#emit(definition.name, tool);
    } catch (err) {
      // A bad entry (written by something else) must not stop the watcher.
      this.#log.warn(
        { key: entry.key, err },
        "ignoring registry entry that is not a valid tool definition",
      );
    }
  }

  /**
   * The definition stored under `key`, or undefined when the value is not a definition or names
   * a tool whose key is another: an entry counts only under the key its name maps to, so
   * whoever may write one key cannot file a definition of another tool there.
   */
  #entryDefinition(key: string, value: Uint8Array): ToolDefinition | undefined {
    const parsed = ToolDefinitionSchema.safeParse(decodeJsonOrUndefined(value));
    if (!parsed.success) {
      this.#log.warn(
        { key, err: parsed.error },
        "ignoring registry entry that is not a valid tool definition",
      );
      return undefined;
    }
    if (this.#subjects.registryKey(parsed.data.name) !== key) {
      this.#log.warn(
        { key, tool: parsed.data.name, expected_key: this.#subjects.registryKey(parsed.data.name) },
        "ignoring registry entry filed under a key its tool name does not map to",
      );
      return undefined;
    }
    return parsed.data;
  }

  #forgetSafeName(name: string): void {
    const safe = safeToolName(name);
    if (this.#bySafeName.get(safe) !== name) return;
    this.#bySafeName.delete(safe);
    const other = [...this.#tools.keys()].find((n) => safeToolName(n) === safe);
    if (other !== undefined) this.#bySafeName.set(safe, other);
  }

  #emit(name: string, tool: CompiledTool | undefined): void {
    for (const listener of this.#listeners) {
      try {
        listener({ name, tool });
      } catch (err) {
        this.#log.warn({ tool: name, err }, "registry listener failed");
      }
    }
  }
}
