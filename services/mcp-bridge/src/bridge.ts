import { Defaults, ErrorCode, ToolmeshError } from "@toolmesh/protocol";
import type { McpServerConfig } from "./config.js";
import { ToolPins } from "./pins.js";
import type { ConnectionState } from "./connection.js";
import type { ServedServerOptions } from "./served-server.js";
import { startServedServer } from "./served-server.js";

/** Options of {@link startBridge}. Durations in ms. */
export interface BridgeOptions extends ServedServerOptions {
  /** The MCP servers, one per file of the MCP folder. */
  servers: readonly McpServerConfig[];
}

/** What the bridge knows about one server right now. */
export interface ServerStatus {
  state: ConnectionState;
  /** Mesh names (`<server>.<tool>`) this process serves. */
  tools: string[];
  /** The last connect or connection error, one line. */
  lastError?: string;
  /** Times the connection was opened again after its first opening. */
  restarts: number;
}

/** A running bridge. */
export interface Bridge {
  /** Each server's state and tools, by server name. */
  status(): Record<string, ServerStatus>;
  /** Stops taking calls, lets running ones finish (at most `graceMs`), closes every server. */
  stop(graceMs?: number): Promise<void>;
  /** Keys of the calls its executors are running now, for what a forced stop abandons. */
  inFlight(): readonly string[];
}

/**
 * Bridges MCP servers into the mesh. Each server gets its own executor, owned by
 * `mcp-bridge:<server>` so replicas share registrations and work consumers, and its own
 * connection (its own stdio process per replica). Its tools are registered as
 * `<server>.<tool>` with the server's full input schema; `tools/list_changed` adds, updates
 * and removes them at once.
 */
export async function startBridge(options: BridgeOptions): Promise<Bridge> {
  const { log } = options;
  const pinning = options.servers.filter((s) => s.pin_tools).map((s) => s.name);
  if (pinning.length > 0 && options.ownerAccount !== undefined) {
    throw new ToolmeshError(
      ErrorCode.InvalidRequest,
      `MCP servers ${pinning.join(", ")} set pin_tools, which needs the mesh account's approvals: unset TOOLMESH_OWNER or pin_tools`,
      { retryable: false },
    );
  }
  const pins =
    pinning.length > 0
      ? await ToolPins.open(options.nc, options.subjects, options.streamLimits)
      : undefined;
  const servers = await Promise.all(
    options.servers.map((config) => startServedServer(options, config, pins)),
  );

  log.info(
    {
      servers: Object.fromEntries(
        servers.map((s) => [
          s.config.name,
          { state: s.connection.state, tools: s.served.names().length },
        ]),
      ),
    },
    "mcp-bridge started",
  );

  const status = (): Record<string, ServerStatus> =>
    Object.fromEntries(
      servers.map((s) => [
        s.config.name,
        {
          state: s.connection.state,
          tools: s.served.names(),
          restarts: s.connection.restarts,
          ...(s.connection.lastError === undefined ? {} : { lastError: s.connection.lastError }),
        },
      ]),
    );

  return {
    status,
    inFlight: () => servers.flatMap((s) => s.executor.inFlight()),
    async stop(graceMs = Defaults.shutdownGraceMs) {
      // Calls in flight still need their server: stop the executors first.
      await Promise.all(servers.map((s) => s.executor.stop(graceMs)));
      await Promise.all(
        servers.map(async (s) => {
          s.unwatch();
          await s.served.settled();
          await s.connection.stop();
        }),
      );
    },
  };
}
