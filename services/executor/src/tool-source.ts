import type { PrivateAddressAllowance } from "@toolmesh/tool-host";
import type { ToolModule } from "@toolmesh/tool-host";

/** Something that hears about tools that were skipped (a pino logger fits). */
export interface LoadLog {
  warn(obj: object, msg: string): void;
}

/**
 * Where an executor's tools come from, as configuration gives it. One object for every kind,
 * so a new kind reads what it needs without a new parameter on every caller. Durations in ms.
 */
export interface ToolSourceSettings {
  /** Folder of builtin tool modules (`TOOLMESH_TOOLS_DIR`). */
  readonly toolsDir: string;
  /** Folder of HTTP tool files and OpenAPI documents (`TOOLMESH_NATIVE_TOOLS_DIR`). */
  readonly nativeToolsDir: string;
  /** A missing HTTP tools folder means no HTTP tools (true for the default folder). */
  readonly nativeToolsDirOptional: boolean;
  /** The environment secrets are read from, at load. */
  readonly env: Readonly<Record<string, string | undefined>>;
  /** URL prefixes HTTP tools may call (`TOOLMESH_NATIVE_ALLOWED_URLS`). Default any. */
  readonly allowedUrls?: readonly string[];
  /** Private addresses outbound HTTP may reach (`TOOLMESH_ALLOW_PRIVATE_ADDRESSES`). */
  readonly allowPrivateAddresses?: PrivateAddressAllowance;
  /**
   * Whether the exact host and port of a URL the operator configured (an HTTP tool's `api_url`,
   * an OpenAPI tool's base URL) skips the private-address check (`TOOLMESH_TRUST_CONFIGURED_HOSTS`),
   * unless the file's `trust_configured_host` says otherwise. Default true.
   */
  readonly trustConfiguredHosts?: boolean;
  /** Largest successful HTTP response body accepted, in bytes. */
  readonly maxResponseBytes?: number;
  /** The fetch every outbound request goes through. Default the guarded `outboundFetch`. */
  readonly fetch?: typeof globalThis.fetch;
}

/**
 * One place tools come from — a module folder, an HTTP tool file, an OpenAPI document, an MCP
 * server — after its configuration was read. `load` defines the tools (each a
 * {@link ToolModule}: what the registry shows and the `handler` that invokes it); `watch`,
 * when the source can change (an MCP server's `list_changed`), reports each new list.
 */
export interface ToolSource {
  /** What the source is, for logs and duplicate warnings: a file path, a server name. */
  readonly origin: string;
  /** The tools it defines now. */
  load(): Promise<readonly ToolModule[]>;
  /**
   * Calls `onChange` with the whole new list each time it changes; returns the function that
   * stops watching. Absent when the tools only change with a restart.
   */
  watch?(onChange: (tools: readonly ToolModule[]) => void): () => void;
}

/**
 * A kind of tool source: finds its sources in the settings. Registering a kind is adding it to
 * {@link EXECUTOR_SOURCE_KINDS} (or, for a process of its own such as the MCP bridge, to the
 * list that process loads).
 */
export interface ToolSourceKind {
  /** Short name for logs: `builtin`, `http`, `openapi`, `mcp`. */
  readonly kind: string;
  /** The sources of this kind the settings configure, in a stable order. */
  discover(settings: ToolSourceSettings, log: LoadLog): Promise<readonly ToolSource[]>;
}

/** A tool and the source it came from. */
export interface SourcedTool {
  module: ToolModule;
  kind: string;
  origin: string;
}

/**
 * Loads every source of every kind, in the kinds' order and then the sources' order. A name
 * defined twice keeps the first and warns. A source that cannot be loaded fails the whole
 * load, naming it (an executor must not start with half its configuration).
 */
export async function loadToolSources(
  kinds: readonly ToolSourceKind[],
  settings: ToolSourceSettings,
  log: LoadLog,
): Promise<SourcedTool[]> {
  const loaded: SourcedTool[] = [];
  const seen = new Map<string, string>();
  for (const kind of kinds) {
    for (const source of await kind.discover(settings, log)) {
      for (const module of await source.load()) {
        const first = seen.get(module.name);
        if (first !== undefined) {
          log.warn(
            { tool: module.name, kept: first, skipped: source.origin },
            "duplicate tool name; the first one wins",
          );
          continue;
        }
        seen.set(module.name, source.origin);
        loaded.push({ module, kind: kind.kind, origin: source.origin });
      }
    }
  }
  return loaded;
}
