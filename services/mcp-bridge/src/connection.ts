import { createInterface } from "node:readline";
import type { Readable } from "node:stream";
import {
  Client,
  SSEClientTransport,
  SseError,
  StreamableHTTPClientTransport,
} from "@modelcontextprotocol/client";
import type { CallToolResult, Progress, Tool, Transport } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";
import { ErrorCode, ToolmeshError } from "@toolmesh/protocol";
import type { FetchLike, ToolContext } from "@toolmesh/tool-host";
import type { Logger } from "@toolmesh/telemetry";
import type { McpServerConfig } from "./config.js";
import { traceToolCall } from "./request-telemetry.js";
import { callAuthorization, sendingAs, withCallAuthorization } from "./call-credential.js";
import { remoteHeaders, stdioArgs, stdioEnv } from "./config.js";
import {
  callError,
  describeError,
  failureKind,
  resultContent,
  resultError,
  unavailable,
} from "./result.js";

/** Where a server connection is in its life. */
export type ConnectionState =
  /** Not running and not wanted yet (a lazy server before its first call, or stopped idle). */
  | "idle"
  /** Waiting out the backoff before the next attempt. */
  | "waiting"
  /** Starting the process or session: `initialize` and the first `tools/list`. */
  | "connecting"
  | "ready"
  | "stopped";

/** Options of {@link ServerConnection}. */
export interface ServerConnectionOptions {
  config: McpServerConfig;
  /** The environment `{ env: VAR }` secrets come from. */
  env: Readonly<Record<string, string | undefined>>;
  /** The fetch of HTTP/SSE transports: the outbound guard. Default the global `fetch`. */
  fetch?: FetchLike;
  log: Logger;
  /**
   * Told the server's complete tool list after every connect and every
   * `notifications/tools/list_changed`. Must not throw.
   */
  onTools: (tools: Tool[]) => Promise<void>;
  /** Keep the server connected even if it is lazy, until its tools were listed once. */
  discover?: boolean;
  /** Checked once the server's tools are known, before each call: an error refuses it. */
  refuse?: (tool: string) => ToolmeshError | undefined;
}

/** A connection lost while its tools were registered; its loss was counted when it closed. */
class LostDuringStart extends Error {
  override readonly name = "LostDuringStart";
  constructor() {
    super("the connection closed during start-up");
  }
}

/** A connection that is up at least this long resets the restart backoff, in ms. */
const STABLE_AFTER_MS = 10_000;
/** Most `tools/list` pages followed before the list is taken as it is. */
const MAX_LIST_PAGES = 1_000;
/** Longest stderr line of a stdio server copied into the log, in characters. */
const MAX_STDERR_CHARS = 2_000;

/** Stderr lines of a starting stdio server kept to explain why it failed to start. */
const STDERR_TAIL_LINES = 40;

const CLIENT_INFO = { name: "toolmesh-mcp-bridge", version: "0.1.0" };

/** `_meta` key carrying the call's idempotency key to the server. */
export const IDEMPOTENCY_META_KEY = "toolmesh/idempotency_key";

/**
 * One MCP server as the bridge sees it: a client connected over stdio, streamable HTTP or
 * SSE that is opened independently of every other server (`initialize` bounded by
 * `connect_timeout_ms`), reopened with exponential backoff when the process crashes or the
 * session breaks, re-initialised when an HTTP session expired, started on demand when lazy
 * and stopped when idle. Calls that find it down wait for it within their own time.
 */
export class ServerConnection {
  readonly #config: McpServerConfig;
  readonly #env: Readonly<Record<string, string | undefined>>;
  readonly #fetch: FetchLike;
  readonly #log: Logger;
  readonly #onTools: (tools: Tool[]) => Promise<void>;
  readonly #refuse: (tool: string) => ToolmeshError | undefined;
  readonly #stopped = new AbortController();
  #keepConnected: boolean;
  #state: ConnectionState = "idle";
  #client: Client | undefined;
  /** The client being opened, so stop() can abort a hanging `initialize`. */
  #opening: Client | undefined;
  #connecting: Promise<Client> | undefined;
  /** Resolved, and cleared, each time a connection is up (before its tools are registered). */
  #connected = new Set<() => void>();
  #failures = 0;
  #notBefore = 0;
  #openedAt = 0;
  #lastError: string | undefined;
  #opens = 0;
  #inFlight = 0;
  #idleTimer: NodeJS.Timeout | undefined;
  #resync: Promise<void> | undefined;
  #resyncAgain = false;
  /** The last stderr lines of the stdio process being started, for the cause of a failure. */
  #stderrTail: string[] = [];
  /** Progress listeners of the calls in flight, by the progress token sent with each. */
  readonly #progress = new Map<string, (progress: Progress) => void>();
  #progressTokens = 0;

  constructor(options: ServerConnectionOptions) {
    this.#config = options.config;
    this.#env = options.env;
    this.#fetch = options.fetch ?? globalThis.fetch;
    this.#log = options.log;
    this.#onTools = options.onTools;
    this.#refuse = options.refuse ?? (() => undefined);
    this.#keepConnected = !options.config.lazy || options.discover === true;
  }

  /** Where the connection is in its life. */
  get state(): ConnectionState {
    return this.#state;
  }

  /** Times the connection was opened again after its first opening. */
  get restarts(): number {
    return Math.max(0, this.#opens - 1);
  }

  /** The last connect or connection error, one line; undefined once connected. */
  get lastError(): string | undefined {
    return this.#lastError;
  }

  /**
   * Connects a server that should be running (not lazy, or lazy with nothing known about its
   * tools), and keeps it connected. Resolves after the first attempt, whether or not it
   * succeeded: a server that fails or hangs is retried in the background and never blocks
   * the others.
   */
  async start(): Promise<void> {
    if (!this.#keepConnected) return;
    await this.#connect().then(
      () => undefined,
      () => this.#supervise(),
    );
  }

  /**
   * Calls a tool. Waits for the server within the call's time (starting it when lazy), sends
   * `tools/call` with the attempt's signal (an abort sends `notifications/cancelled`) and
   * progress reported to `ctx.emit`, and converts the result ({@link resultContent}).
   */
  async call(tool: string, args: Record<string, unknown>, ctx: ToolContext): Promise<string> {
    this.#inFlight++;
    this.#clearIdle();
    try {
      for (let resend = 0; ; resend++) {
        const client = await this.#acquire(ctx.signal);
        const refused = this.#refuse(tool);
        if (refused !== undefined) throw refused;
        // Progress is routed by a token of ours rather than the SDK's `onprogress`, which
        // drops a notification that arrives in the same read as the response
        // (typescript-sdk#2580): the last "100 %" event of a tool is the usual casualty.
        const progressToken = `toolmesh-${++this.#progressTokens}`;
        this.#progress.set(progressToken, (progress) => ctx.emit(progress));
        try {
          const authorization = callAuthorization(this.#config, ctx.credential);
          const result: CallToolResult = await traceToolCall(this.#config.name, tool, (traceMeta) =>
            sendingAs(authorization, () =>
              client.request(
                {
                  method: "tools/call",
                  params: {
                    name: tool,
                    arguments: args,
                    _meta: {
                      ...traceMeta,
                      progressToken,
                      [IDEMPOTENCY_META_KEY]: ctx.idempotencyKey,
                    },
                  },
                },
                {
                  signal: ctx.signal,
                  // The executor ends the attempt (and aborts the signal) first; this only
                  // keeps the SDK's own 60 s default from cutting long calls short.
                  timeout: Math.max(1_000, ctx.deadlineAt - Date.now() + 5_000),
                },
              ),
            ),
          );
          if (result.isError === true) throw resultError(result, this.#config.name, tool);
          return resultContent(result, this.#config.structured_content);
        } catch (err) {
          if (ctx.signal.aborted) throw ctx.signal.reason;
          if (err instanceof ToolmeshError) throw err;
          const kind = failureKind(err);
          if (kind === "session_expired") {
            // The server forgot the session (restarted, or expired it): the request was not
            // run, so it is safe to initialise again and send it once more.
            this.#discard(client, err, { backoff: false });
            if (resend === 0) {
              this.#log.info({ tool }, "MCP session expired; initialising again");
              continue;
            }
          } else if (kind === "connection") {
            this.#discard(client, err, { backoff: true });
          }
          throw callError(err, this.#config.name, tool, this.#config.internal_error);
        } finally {
          this.#progress.delete(progressToken);
        }
      }
    } finally {
      this.#inFlight--;
      this.#armIdle();
    }
  }

  /**
   * Resolves once a server that is kept connected is up, within the bound a call's own wait
   * has (see `call`), so a tool attempt's timeout starts after a restart rather than during it
   * (the executor's `ToolModule.ready`). Resolves at once when connected, and for a lazy
   * server not running: its call starts it. Resolves as soon as the connection is up, before
   * its tools are registered: that registration may wait for the very calls waiting here.
   */
  async ready(signal: AbortSignal): Promise<void> {
    if (this.#client !== undefined || !this.#keepConnected || this.#state === "stopped") return;
    await this.#bounded(signal, (resolve, reject) => {
      const up = () => resolve(undefined);
      this.#connected.add(up);
      this.#connect().catch(reject);
      return () => this.#connected.delete(up);
    });
  }

  /** Closes the connection (a stdio server is stopped) and stops reconnecting. */
  async stop(): Promise<void> {
    this.#state = "stopped";
    this.#keepConnected = false;
    this.#stopped.abort();
    this.#clearIdle();
    const client = this.#client ?? this.#opening;
    this.#client = undefined;
    this.#opening = undefined;
    if (client !== undefined) await closeClient(client, { terminate: true });
    await this.#connecting?.catch(() => undefined);
    await this.#resync?.catch(() => undefined);
  }

  /** A connected client, connecting when needed; bounded by the call's signal. */
  async #acquire(signal: AbortSignal): Promise<Client> {
    if (this.#client !== undefined) return this.#client;
    if (this.#state === "stopped") {
      throw new ToolmeshError(ErrorCode.Unavailable, "the MCP bridge is shutting down", {
        retryable: true,
        details: { server: this.#config.name },
      });
    }
    return this.#bounded(signal, (resolve, reject) => {
      this.#connect().then(resolve, reject);
      return () => undefined;
    });
  }

  /**
   * Waits for `start` to resolve, bounded by the call's signal and by the connect timeout
   * past the backoff; a server that will not even be tried again for a while, or is still
   * down when the bound passes, is `unavailable`: the call's retry policy turns that into
   * another attempt later, rather than the attempt waiting out its timeout.
   */
  async #bounded<T>(
    signal: AbortSignal,
    start: (resolve: (value: T) => void, reject: (err: unknown) => void) => () => void,
  ): Promise<T> {
    const backoffLeft = Math.max(0, this.#notBefore - Date.now());
    if (backoffLeft > this.#config.connect_timeout_ms) {
      throw unavailable(this.#config.name, this.#lastError ?? "not connected", {
        server: this.#config.name,
        retry_in_ms: backoffLeft,
      });
    }
    const waitMs = this.#config.connect_timeout_ms + backoffLeft;
    let timer: NodeJS.Timeout | undefined;
    let onAbort: (() => void) | undefined;
    let cleanUp = (): void => undefined;
    try {
      return await new Promise<T>((resolve, reject) => {
        cleanUp = start(resolve, reject);
        timer = setTimeout(
          () => reject(unavailable(this.#config.name, this.#lastError ?? "not connected yet")),
          waitMs,
        );
        onAbort = () => reject(signal.reason as Error);
        signal.addEventListener("abort", onAbort, { once: true });
      });
    } catch (err) {
      if (err instanceof ToolmeshError || signal.aborted) throw err;
      throw unavailable(this.#config.name, err);
    } finally {
      cleanUp();
      clearTimeout(timer);
      if (onAbort !== undefined) signal.removeEventListener("abort", onAbort);
    }
  }

  /** Opens the connection once for every caller at the same time. */
  #connect(): Promise<Client> {
    if (this.#client !== undefined) return Promise.resolve(this.#client);
    this.#connecting ??= this.#open().finally(() => {
      this.#connecting = undefined;
    });
    return this.#connecting;
  }

  /** Keeps a server that should run connected: tries again once the backoff has passed. */
  #supervise(): void {
    if (!this.#keepConnected || this.#client !== undefined || this.#connecting !== undefined)
      return;
    this.#connect().then(
      () => undefined,
      () => this.#supervise(),
    );
  }

  async #open(): Promise<Client> {
    const wait = this.#notBefore - Date.now();
    if (wait > 0) {
      this.#state = "waiting";
      await delay(wait, this.#stopped.signal);
    }
    if (this.#stopped.signal.aborted) throw new Error("stopped");
    this.#state = "connecting";
    const client = new Client(CLIENT_INFO, { capabilities: {} });
    this.#opening = client;
    try {
      const transport = await this.#transport();
      client.onclose = () => this.#closed(client);
      client.onerror = (err) => {
        this.#log.debug({ err: describeError(err) }, "MCP transport error");
        // A legacy SSE session lives as long as its event stream. The stream's own reconnect
        // lands in a new session that was never initialised (a restarted server refuses its
        // calls), so a broken stream is a lost connection: initialise again.
        if (err instanceof SseError && this.#client === client) {
          this.#discard(client, err, { backoff: false });
        }
      };
      // Replaces the SDK's own progress dispatch; see call(). Notifications are handled in
      // arrival order, each before the response that follows it resumes its caller.
      client.setNotificationHandler("notifications/progress", (notification) => {
        const { progressToken, _meta: _ignored, ...progress } = notification.params;
        this.#progress.get(String(progressToken))?.(progress);
      });
      client.setNotificationHandler("notifications/tools/list_changed", () => {
        if (this.#client === client) this.#resyncTools(client);
      });
      const timeout = this.#config.connect_timeout_ms;
      const started = Date.now();
      await client.connect(transport, { timeout, signal: this.#stopped.signal });
      // A server without the tools capability has none to list (and may refuse the method).
      const tools =
        client.getServerCapabilities()?.tools === undefined
          ? []
          : await listTools(client, Math.max(1, timeout - (Date.now() - started)));
      if (this.#stopped.signal.aborted) throw new Error("stopped");
      this.#opening = undefined;
      this.#client = client;
      this.#state = "ready";
      for (const resolve of this.#connected) resolve();
      this.#connected.clear();
      this.#opens++;
      this.#openedAt = Date.now();
      this.#lastError = undefined;
      this.#log.info(
        {
          transport: this.#config.transport,
          ...(transport instanceof StdioClientTransport ? { pid: transport.pid } : {}),
          server_info: client.getServerVersion(),
          tools: tools.length,
        },
        "MCP server ready",
      );
      await this.#onTools(tools);
      // Lost while its tools were registered (a call may run from the moment the connection is
      // up, see ready()): the loss was counted and logged already; the reconnect is left to
      // this attempt's caller.
      if (this.#client !== client) throw new LostDuringStart();
      // A lazy server started to learn its tools runs only when called from now on.
      if (this.#config.lazy) this.#keepConnected = false;
      this.#armIdle();
      return client;
    } catch (err) {
      if (this.#opening === client) this.#opening = undefined;
      if (this.#client === client) this.#client = undefined;
      await closeClient(client, { terminate: false });
      if (this.#stopped.signal.aborted || err instanceof LostDuringStart) throw err;
      const delayMs = this.#backoff();
      this.#lastError = withCause(describeError(err), this.#stderrTail);
      this.#state = this.#keepConnected ? "waiting" : "idle";
      this.#log.warn(
        { err: this.#lastError, retry_in_ms: delayMs, failures: this.#failures },
        "cannot connect to MCP server",
      );
      throw err;
    }
  }

  /** Counts one more failure in a row and returns the delay before the next attempt. */
  #backoff(): number {
    const { initial_delay_ms: initial, max_delay_ms: max } = this.#config.reconnect;
    this.#failures++;
    const delayMs = Math.min(initial * 2 ** (this.#failures - 1), max);
    this.#notBefore = Date.now() + delayMs;
    return delayMs;
  }

  /** The transport's own close: a stdio process that exited, a closed session. */
  #closed(client: Client): void {
    if (this.#client !== client) return; // closed on purpose, or an older connection
    this.#lost("connection closed", { backoff: true });
  }

  /** Drops a connection found broken by a request; the next user opens a new one. */
  #discard(client: Client, err: unknown, options: { backoff: boolean }): void {
    if (this.#client !== client) return;
    this.#lost(describeError(err), options);
    void closeClient(client, { terminate: false });
  }

  #lost(reason: string, options: { backoff: boolean }): void {
    this.#client = undefined;
    this.#clearIdle();
    if (Date.now() - this.#openedAt >= STABLE_AFTER_MS) this.#failures = 0;
    const delayMs = options.backoff ? this.#backoff() : 0;
    this.#lastError = reason;
    this.#state = this.#keepConnected ? "waiting" : "idle";
    this.#log.warn(
      this.#keepConnected
        ? { err: reason, reconnect_in_ms: delayMs }
        : { err: reason, reconnect: "on the next call" },
      "MCP server connection lost",
    );
    this.#supervise();
  }

  /** Lists the tools again after `notifications/tools/list_changed`; changes coalesce. */
  #resyncTools(client: Client): void {
    if (this.#resync !== undefined) {
      this.#resyncAgain = true;
      return;
    }
    this.#resync = (async () => {
      do {
        this.#resyncAgain = false;
        const tools = await listTools(client, this.#config.connect_timeout_ms);
        if (this.#client !== client) return;
        this.#log.info({ tools: tools.length }, "MCP tool list changed");
        await this.#onTools(tools);
      } while (this.#resyncAgain && this.#client === client);
    })()
      .catch((err: unknown) => {
        this.#log.warn({ err: describeError(err) }, "cannot list the MCP server's tools again");
        if (failureKind(err) !== "answered") this.#discard(client, err, { backoff: true });
      })
      .finally(() => {
        this.#resync = undefined;
      });
  }

  #armIdle(): void {
    this.#clearIdle();
    const config = this.#config;
    if (config.transport !== "stdio" || !config.lazy || config.idle_timeout_ms === undefined)
      return;
    if (this.#inFlight > 0 || this.#client === undefined || this.#keepConnected) return;
    const idleMs = config.idle_timeout_ms;
    this.#idleTimer = setTimeout(() => {
      const client = this.#client;
      if (client === undefined || this.#inFlight > 0) return;
      this.#client = undefined;
      this.#state = "idle";
      this.#log.info({ idle_timeout_ms: idleMs }, "MCP server idle; stopped");
      void closeClient(client, { terminate: false });
    }, idleMs);
    this.#idleTimer.unref();
  }

  #clearIdle(): void {
    clearTimeout(this.#idleTimer);
    this.#idleTimer = undefined;
  }

  async #transport(): Promise<Transport> {
    const config = this.#config;
    if (config.transport === "stdio") {
      const transport = new StdioClientTransport({
        command: config.command,
        args: await stdioArgs(config, this.#env),
        env: await stdioEnv(config, this.#env),
        ...(config.cwd === undefined ? {} : { cwd: config.cwd }),
        stderr: "pipe",
      });
      const stderr = transport.stderr;
      const tail: string[] = [];
      this.#stderrTail = tail;
      if (stderr !== null) {
        // A PassThrough, returned before the process starts so no early line is lost.
        const lines = createInterface({ input: stderr as Readable, crlfDelay: Infinity });
        lines.on("line", (line) => {
          if (line.trim() === "") return;
          const kept = line.slice(0, MAX_STDERR_CHARS);
          tail.push(kept);
          if (tail.length > STDERR_TAIL_LINES) tail.shift();
          this.#log.info({ stderr: kept }, "MCP server stderr");
        });
      }
      return transport;
    }
    return remoteTransport(config, await remoteHeaders(config, this.#env), this.#fetch);
  }
}

/**
 * The transport of a streamable HTTP or SSE server: the one place where the bridge makes
 * HTTP requests to MCP servers, each of them (POSTs, event streams, session DELETEs) through
 * the `fetch` given here, so an outbound policy applies to all of them.
 */
export function remoteTransport(
  config: Extract<McpServerConfig, { transport: "http" | "sse" }>,
  headers: Record<string, string>,
  fetch: FetchLike = globalThis.fetch,
): Transport {
  const url = new URL(config.url);
  const options = { requestInit: { headers }, fetch: withCallAuthorization(fetch) };
  return config.transport === "http"
    ? new StreamableHTTPClientTransport(url, options)
    : new SSEClientTransport(url, options);
}

/**
 * A failure to start a stdio server with its real cause, which is usually on the process's
 * stderr ("Error: Cannot find module …", "ModuleNotFoundError: …"), not in the closed pipe the
 * client saw: the last line that names an error, else the last line.
 */
function withCause(failure: string, stderrTail: readonly string[]): string {
  const lines = stderrTail.filter((l) => !/^\s+(at |File ")/.test(l));
  const named = lines.findLast((l) =>
    /^\s*(\w[\w.$]*(Error|Exception)\b|error\b|fatal\b)/i.test(l),
  );
  const cause = (named ?? lines.at(-1))?.trim();
  return cause === undefined || failure.includes(cause) ? failure : `${failure}; stderr: ${cause}`;
}

/** Every tool of the server, following `nextCursor` pages. */
async function listTools(client: Client, timeout: number): Promise<Tool[]> {
  const tools: Tool[] = [];
  const seen = new Set<string>();
  let cursor: string | undefined;
  for (let page = 0; page < MAX_LIST_PAGES; page++) {
    // Page by page with `tools/list` itself: the SDK's listTools() would aggregate and cache.
    const result = await client.request(
      { method: "tools/list", params: cursor === undefined ? {} : { cursor } },
      { timeout },
    );
    tools.push(...result.tools);
    cursor = result.nextCursor;
    // A server repeating a cursor would loop forever.
    if (cursor === undefined || seen.has(cursor)) break;
    seen.add(cursor);
  }
  return tools;
}

/** Closes a client without throwing; `terminate` also ends an HTTP session (DELETE). */
async function closeClient(client: Client, options: { terminate: boolean }): Promise<void> {
  const transport = client.transport;
  if (options.terminate && transport instanceof StreamableHTTPClientTransport) {
    await Promise.race([
      transport.terminateSession().catch(() => undefined),
      delay(1_000, undefined).catch(() => undefined),
    ]);
  }
  await client.close().catch(() => undefined);
}

function delay(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted === true) {
      reject(new Error("stopped"));
      return;
    }
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(new Error("stopped"));
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
