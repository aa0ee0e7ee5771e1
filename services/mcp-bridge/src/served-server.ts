import type { NatsConnection } from "@nats-io/nats-core";
import type { Tool } from "@modelcontextprotocol/client";
import type { Subjects, TokenEndpoint, ToolDefinition } from "@toolmesh/protocol";
import type { StreamLimits } from "@toolmesh/nats";
import type { ToolRegistry } from "@toolmesh/registry";
import type { Logger, Tracer } from "@toolmesh/telemetry";
import type {
  Executor,
  ExecutorOptions,
  PrivateAddressAllowance,
  SecretBox,
  ToolContext,
  ToolModule,
} from "@toolmesh/tool-host";
import {
  ServedTools,
  declaredCredentials,
  outboundFetch,
  startExecutor,
  trustedHostsOf,
} from "@toolmesh/tool-host";
import { Defaults, ErrorCode, ToolmeshError } from "@toolmesh/protocol";
import type { McpServerConfig } from "./config.js";
import type { ToolPins } from "./pins.js";
import { ServerConnection } from "./connection.js";

/** What serving one MCP server needs; the bridge's options less its servers. Durations in ms. */
export interface ServedServerOptions {
  nc: NatsConnection;
  subjects: Subjects;
  /** The registry, in the mesh account; unused (and may be left out) with `ownerAccount`. */
  registry?: ToolRegistry | undefined;
  /**
   * The tool owner whose NATS account this bridge lives in (ADR 0031): see the executor's
   * `ownerAccount`. Its tools are then that owner's in the registry. `pin_tools` needs the
   * mesh account (the approvals bucket).
   */
  ownerAccount?: string | undefined;
  log: Logger;
  tracer: Tracer;
  /** The environment `{ env: VAR }` secrets and `auth.env` are read from. */
  env: Readonly<Record<string, string | undefined>>;
  streamLimits?: StreamLimits;
  /** Calls one server's tools run at once in this process. Default 16. */
  concurrency?: number;
  /** See the executor's `ackWaitMs`. Default 10 000. */
  ackWaitMs?: number;
  /** See the executor's `callRetentionMs`. Default 24 h. */
  callRetentionMs?: number;
  /** See the executor's `maxResultBytes`. Default 512 KiB. */
  maxResultBytes?: number;
  /** Where each call's attempts and end are recorded (ADR 0060): see the executor's `audit`. */
  audit?: ExecutorOptions["audit"];
  /** How long a removed tool's running calls may take to finish, in ms. Default 10 000. */
  removeGraceMs?: number;
  /** Private addresses HTTP/SSE servers may be reached at (`TOOLMESH_ALLOW_PRIVATE_ADDRESSES`). Default none. */
  allowPrivateAddresses?: PrivateAddressAllowance;
  /**
   * Whether each HTTP/SSE server's own `url` host is trusted (`TOOLMESH_TRUST_CONFIGURED_HOSTS`),
   * unless its file's `trust_configured_host` says otherwise. Default true.
   */
  trustConfiguredHosts?: boolean;
  /** Opens users' secrets, for servers whose `credentials` are `user-secret` or `token-exchange`. */
  secretBox?: SecretBox | undefined;
  /** The authorization server's token endpoint, for servers whose `credentials` are `token-exchange`. */
  tokenEndpoint?: TokenEndpoint | undefined;
  /** See `ExecutorOptions.userSecretsReplicas`. */
  userSecretsReplicas?: number | undefined;
}

/**
 * What a server's executor needs for the credentials its tools act with: the tools are listed
 * after the executor starts, so their type is named up front and checked then.
 */
function callerCredentials(
  options: ServedServerOptions,
  config: McpServerConfig,
): Pick<
  ExecutorOptions,
  "credentialTypes" | "secretBox" | "tokenEndpoint" | "userSecretsReplicas"
> {
  const type = config.credentials?.type;
  if (type === undefined || type === "service") return {};
  return {
    credentialTypes: [type],
    userSecretsReplicas: options.userSecretsReplicas,
    ...(options.secretBox === undefined ? {} : { secretBox: options.secretBox }),
    ...(options.tokenEndpoint === undefined ? {} : { tokenEndpoint: options.tokenEndpoint }),
  };
}

/** The registry owner of a server's tools; every bridge replica uses the same one. */
export function ownerOf(server: string): string {
  return `mcp-bridge:${server}`;
}

/** The mesh name of an MCP tool. Dots are safe: subject tokens escape them. */
export function meshToolName(server: string, tool: string): string {
  return `${server}.${tool}`;
}

/** The outbound guard of one server: its own configured host trusted, unless overridden. */
export function serverFetch(options: ServedServerOptions, config: McpServerConfig): typeof fetch {
  return outboundFetch(
    options.allowPrivateAddresses,
    config.transport === "stdio"
      ? []
      : trustedHostsOf(config.url, config.trust_configured_host, options.trustConfiguredHosts),
  );
}

/**
 * The tool module that serves one MCP tool of a server in the mesh, invoking it by `call`;
 * each attempt's timeout starts once `ready` resolves (the server is up after a restart).
 */
export function mcpToolModule(
  config: McpServerConfig,
  tool: Tool,
  call: (tool: string, args: Record<string, unknown>, ctx: ToolContext) => Promise<string>,
  ready?: (signal: AbortSignal) => Promise<void>,
): ToolModule {
  const annotations: Record<string, unknown> = { ...tool.annotations };
  if (tool.title !== undefined && annotations.title === undefined) annotations.title = tool.title;
  return {
    name: meshToolName(config.name, tool.name),
    description: tool.description ?? "",
    parameters: tool.inputSchema,
    kind: "mcp",
    // The bridge forwards the server's progress notifications as progress events.
    progress: true,
    // Every param of an MCP tool is the server's; none is a toolmesh system param.
    systemParams: [],
    ...(Object.keys(annotations).length === 0 ? {} : { annotations }),
    origin: { server: config.name, tool: tool.name, transport: config.transport },
    ...(config.groups === undefined ? {} : { groups: config.groups }),
    ...(config.timeout_ms === undefined ? {} : { timeoutMs: config.timeout_ms }),
    ...(config.retry === undefined ? {} : { retry: config.retry }),
    ...(config.credentials === undefined
      ? {}
      : { credentials: declaredCredentials(config.credentials) }),
    handler: (args, ctx) => call(tool.name, args, ctx),
    ...(ready === undefined ? {} : { ready }),
  };
}

/** The refusal of a call of a tool whose definition changed since its approval. */
export function definitionNotApproved(server: string, tool: string): ToolmeshError {
  return new ToolmeshError(
    ErrorCode.ToolDisabled,
    `tool "${meshToolName(server, tool)}" is disabled: MCP server "${server}" changed its definition, which awaits approval (toolmesh tools approve ${server} ${tool})`,
    {
      retryable: false,
      details: {
        tool: meshToolName(server, tool),
        server,
        reason: "definition_not_approved",
      },
    },
  );
}

/**
 * A lazy server's catalog without starting it: the registry's entries of the server under
 * `owner` (what an earlier run or another replica listed), else the file's `tools`, else
 * undefined (the server must be started once to list its tools).
 */
export function lazyCatalog(
  config: McpServerConfig,
  registered: readonly ToolDefinition[],
  owner: string,
): Tool[] | undefined {
  const cached = registered.filter((d) => d.owner === owner && d.origin?.server === config.name);
  if (cached.length > 0) return cached.map((d) => toolFromDefinition(d, config.name));
  return config.tools?.map((t) => ({
    name: t.name,
    description: t.description,
    inputSchema: t.inputSchema as Tool["inputSchema"],
    ...(t.annotations === undefined ? {} : { annotations: t.annotations }),
  }));
}

/**
 * Starts one server's executor, connects to the server (in the background: the bridge is up
 * once the executor is) and keeps the served tools in step with the server's list and, for
 * pinned servers, its approvals.
 */
export function startServedServer(
  options: ServedServerOptions,
  config: McpServerConfig,
  pins: ToolPins | undefined,
): Promise<ServedServer> {
  return ServedServer.start(options, config, pins);
}

/** One bridged MCP server: its executor, connection and served tools. */
export class ServedServer {
  readonly config: McpServerConfig;
  readonly executor: Executor;
  readonly served: ServedTools;
  readonly #options: ServedServerOptions;
  readonly #owner: string;
  readonly #log: Logger;
  readonly #pinned: ToolPins | undefined;
  #connection: ServerConnection | undefined;
  #syncing: Promise<void> = Promise.resolve();
  /** MCP names of listed tools whose definition is not approved (pinned servers). */
  #unapproved = new Set<string>();
  /** The server's last tool list, checked again when its approvals change. */
  #lastListed: Tool[] | undefined;
  #unwatch: () => void = () => undefined;

  private constructor(
    options: ServedServerOptions,
    config: McpServerConfig,
    pins: ToolPins | undefined,
    owner: string,
    log: Logger,
    executor: Executor,
  ) {
    this.#options = options;
    this.config = config;
    this.#owner = owner;
    this.#log = log;
    this.executor = executor;
    this.#pinned = config.pin_tools ? pins : undefined;
    this.served = new ServedTools(executor, log, options.removeGraceMs ?? Defaults.shutdownGraceMs);
  }

  /** See {@link startServedServer}. */
  static async start(
    options: ServedServerOptions,
    config: McpServerConfig,
    pins: ToolPins | undefined,
  ): Promise<ServedServer> {
    // In an owner's account the mesh files every tool under that owner.
    const owner = options.ownerAccount ?? ownerOf(config.name);
    const log = options.log.child({ server: config.name });
    const executor = await startExecutor({
      nc: options.nc,
      subjects: options.subjects,
      registry: options.registry,
      ownerAccount: options.ownerAccount,
      tracer: options.tracer,
      log,
      tools: [],
      owner,
      ...(options.streamLimits === undefined ? {} : { streamLimits: options.streamLimits }),
      ...(options.concurrency === undefined ? {} : { concurrency: options.concurrency }),
      ...(options.ackWaitMs === undefined ? {} : { ackWaitMs: options.ackWaitMs }),
      ...(options.callRetentionMs === undefined
        ? {}
        : { callRetentionMs: options.callRetentionMs }),
      ...(options.maxResultBytes === undefined ? {} : { maxResultBytes: options.maxResultBytes }),
      audit: options.audit,
      ...callerCredentials(options, config),
    });
    const server = new ServedServer(options, config, pins, owner, log, executor);
    await server.#connect();
    return server;
  }

  /** The connection to the server. */
  get connection(): ServerConnection {
    if (this.#connection === undefined) throw new Error("the served server is not started");
    return this.#connection;
  }

  /** Stops following the server's approvals (pinned servers). */
  unwatch(): void {
    this.#unwatch();
  }

  /**
   * Connects to the server in the background, serving a lazy server's known catalog meanwhile,
   * and follows a pinned server's approvals.
   */
  async #connect(): Promise<void> {
    const { config } = this;
    // A lazy server's catalog comes from the registry (what an earlier run or another replica
    // listed), else from the file, else the server is started once to list its tools.
    const known = config.lazy
      ? lazyCatalog(config, (await this.#options.registry?.fetchAll()) ?? [], this.#owner)
      : undefined;
    this.#connection = new ServerConnection({
      config,
      env: this.#options.env,
      fetch: serverFetch(this.#options, config),
      log: this.#log,
      onTools: (tools) => this.#syncTools(tools),
      refuse: (tool) => this.#refuse(tool),
      discover: config.lazy && known === undefined,
    });
    if (known !== undefined) await this.#syncTools(known, false);
    // Not awaited: the bridge is up once every server's executor is; each server connects
    // (or keeps trying) on its own.
    void this.#connection.start();
    // An approval (or a replica's finding) changes the key: check the last list again.
    const pinned = this.#pinned;
    if (pinned !== undefined)
      this.#unwatch = await pinned.watch(config.name, () => {
        if (this.#lastListed !== undefined) void this.#syncTools(this.#lastListed);
      });
  }

  /** Makes the served tools match the server's list; one sync at a time, in order. */
  #syncTools(tools: Tool[], fromServer = true): Promise<void> {
    this.#syncing = this.#syncing.then(() =>
      this.#applyTools(fromServer ? this.#approvedOnly(tools) : Promise.resolve(tools)).catch(
        (err: unknown) => {
          this.#log.error({ err }, "cannot sync MCP tools");
        },
      ),
    );
    return this.#syncing;
  }

  /**
   * The tools of a pinned server whose definitions are approved. Newly unapproved ones are
   * logged, and unregistered even when an earlier run registered them.
   */
  async #approvedOnly(tools: Tool[]): Promise<Tool[]> {
    const pinned = this.#pinned;
    if (pinned === undefined) return tools;
    const { config } = this;
    this.#lastListed = tools;
    const verdict = await pinned.check(config.name, tools);
    if (verdict.pinnedOnFirstUse) {
      this.#log.info({ tools: tools.length }, "MCP tool definitions pinned on first use");
    }
    const before = this.#unapproved;
    this.#unapproved = new Set(verdict.unapproved.map((u) => u.tool));
    for (const u of verdict.unapproved) {
      if (before.has(u.tool)) continue;
      this.#log.warn(
        {
          tool: u.tool,
          change: u.change,
          fields: u.fields,
          sha256: u.sha256,
          ...(u.approved_sha256 === undefined ? {} : { approved_sha256: u.approved_sha256 }),
          approve: `toolmesh tools approve ${config.name} ${u.tool}`,
        },
        "MCP tool definition not approved; tool disabled until approved",
      );
      const name = meshToolName(config.name, u.tool);
      // Without the registry (an owner's account) the mesh refuses to remove another's tool.
      const { registry } = this.#options;
      const ours = registry === undefined || registry.get(name)?.definition.owner === this.#owner;
      if (!this.served.has(name) && ours) {
        await this.executor.removeTool(name, 0);
      }
    }
    return tools.filter((t) => verdict.approved.has(t.name));
  }

  /** A call of a tool whose definition changed since its approval is refused. */
  #refuse(tool: string): ToolmeshError | undefined {
    return this.#unapproved.has(tool) ? definitionNotApproved(this.config.name, tool) : undefined;
  }

  async #applyTools(listed: Promise<Tool[]>): Promise<void> {
    const tools = await listed;
    const next = new Map<string, ToolModule>();
    for (const tool of tools) {
      if (tool.execution?.taskSupport === "required") {
        this.#log.warn(
          { tool: tool.name },
          "MCP tool runs only as a task, which the bridge does not support; skipped",
        );
        continue;
      }
      const module = mcpToolModule(
        this.config,
        tool,
        (name, args, ctx) => this.connection.call(name, args, ctx),
        (signal) => this.connection.ready(signal),
      );
      next.set(module.name, module);
    }
    const { added, removed } = await this.served.apply([...next.values()]);
    if (added.length > 0 || removed.length > 0) {
      this.#log.info({ added, removed, tools: this.served.names() }, "MCP tools synced");
    }
  }
}

/** A registry entry written by an earlier run, as the MCP tool it came from. */
export function toolFromDefinition(definition: ToolDefinition, server: string): Tool {
  const origin = definition.origin as { tool?: unknown } | undefined;
  const prefix = `${server}.`;
  const name =
    typeof origin?.tool === "string"
      ? origin.tool
      : definition.name.startsWith(prefix)
        ? definition.name.slice(prefix.length)
        : definition.name;
  return {
    name,
    description: definition.description,
    inputSchema: definition.parameters as Tool["inputSchema"],
    ...(definition.annotations === undefined ? {} : { annotations: definition.annotations }),
  };
}
