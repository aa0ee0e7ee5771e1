import { randomUUID } from "node:crypto";
import { createServer } from "node:http";
import type { IncomingMessage, Server as HttpServer, ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import type { McpHttpHandler, RequestId, Server } from "@modelcontextprotocol/server";
import { SUPPORTED_PROTOCOL_VERSIONS, createMcpHandler } from "@modelcontextprotocol/server";
import { ROOT_CONTEXT, propagation } from "@opentelemetry/api";
import type { Context, Span } from "@opentelemetry/api";
import type { Logger, Tracer } from "@toolmesh/telemetry";
import { SpanKind } from "@toolmesh/telemetry";
import type { Authenticator, Principal, ToolNames } from "./auth.js";
import { AuthError, TOOL_NAMES } from "./auth.js";
import type { GatewayConfig } from "./config.js";
import { LegacyExchange } from "./exchange.js";
import {
  TOOLS_CHANGED,
  headerOf,
  isJsonContentType,
  isModernRequest,
  metaTraceContext,
  parseMessages,
  readBody,
  rpcError,
  sendJson,
  wantsProgress,
  writeWebResponse,
} from "./http-util.js";
import { CredentialLimits } from "./limits.js";
import type { LimitRefusal } from "./limits.js";
import type { MeshCredentialLimits } from "./mesh-limits.js";
import type { CallObserver, RequestScope } from "./mcp-server.js";
import { cancelRequest, createMcpServer, requestAuthInfo } from "./mcp-server.js";
import { InputRequired } from "./input-required.js";
import { ApprovalInput } from "./approval-input.js";
import { ConsentInput } from "./consent-input.js";
import { MissingArgumentsInput } from "./missing-arguments-input.js";
import type { MeshView } from "./mesh-view.js";

/** How long an idle connection is kept, in ms, and the shorter time the Keep-Alive header advertises, in s. */
const KEEP_ALIVE_MS = 65_000;
const ADVERTISED_KEEP_ALIVE_S = 55;
import { ExchangeTransport } from "./transport.js";

/** What {@link createGatewayServer} needs. */
export interface GatewayServerOptions {
  config: GatewayConfig;
  auth: Authenticator;
  mesh: MeshView;
  log: Logger;
  tracer: Tracer;
  version: string;
  /** Whether this replica is alive (`/healthz`); default always. */
  alive?: () => boolean;
  /** Whether this replica can serve (NATS up, not draining). */
  ready: () => { ok: boolean; detail?: string };
  observe: CallObserver;
  /** Subscribes to changes of the tenant's tool list; returns the unsubscribe function. */
  onToolsChanged: (tenant: string, listener: () => void) => () => void;
  /** Per-credential limits shared by every replica (`TOOLMESH_GATEWAY_LIMITS=mesh`). */
  meshLimits?: MeshCredentialLimits;
}

/** The gateway's HTTP server, not yet listening. */
export interface GatewayServer {
  readonly http: HttpServer;
  /** Starts listening; resolves with the port. */
  listen(): Promise<number>;
  /** Stops taking requests and ends the open streams. */
  close(): Promise<void>;
  /** Requests being served now. */
  inFlight(): number;
}

const MCP_PATH = /^\/mcp(?:\/agents\/([^/]+))?\/?$/;

/**
 * The tool names a request is served: the endpoint's `?names=` when it has one, else its
 * credential's; undefined for a value that is not one of {@link TOOL_NAMES}.
 */
function namesOf(req: IncomingMessage, principal: Principal): ToolNames | undefined {
  const query = new URL(req.url ?? "/", "http://gateway").searchParams.get("names");
  if (query === null) return principal.names ?? "mesh";
  return TOOL_NAMES.find((names) => names === query);
}

/** A request that passed the edge: who it acts for, and its admission to release once. */
interface Admitted {
  scope: RequestScope;
  release: () => void;
}

/**
 * Builds the HTTP side of the gateway: `/mcp` (and `/mcp/agents/{agent}`) serving the
 * 2026-07-28 revision and 2025-era sessions from one endpoint, `/readyz`, `/healthz` and the
 * protected-resource metadata.
 */
export function createGatewayServer(options: GatewayServerOptions): GatewayServer {
  return new GatewayEdge(options);
}

/**
 * The gateway's HTTP edge. A request passes the edge checks (origin, credential, agent, method,
 * media types, admission), then its era's leg: 2025-era messages go to the process's one legacy
 * server through an {@link ExchangeTransport}, each POST one {@link LegacyExchange}; 2026-07-28
 * requests go to the SDK's per-request handler, whose ladder validates the envelope and the
 * `Mcp-Method`/`Mcp-Name` headers. Either way the admission is released in one place.
 */
class GatewayEdge implements GatewayServer {
  readonly http: HttpServer;
  readonly #o: GatewayServerOptions;
  readonly #limits: CredentialLimits;
  readonly #legacy: Server;
  readonly #input: InputRequired;
  readonly #transport = new ExchangeTransport();
  /** The SDK's 2026-07-28 handler of each tenant seen: its `subscriptions/listen` streams. */
  readonly #modern = new Map<string, { handler: McpHttpHandler; stop: () => void }>();
  readonly #streams = new Set<ServerResponse>();
  #inFlight = 0;

  constructor(options: GatewayServerOptions) {
    this.#o = options;
    const { config, mesh, version, observe } = options;
    this.#limits = new CredentialLimits({
      maxConcurrent: config.maxConcurrent,
      ratePerS: config.ratePerS,
      burst: config.rateBurst,
    });
    const stored = async (tenant: string, id: string) =>
      (await mesh.record(tenant, id)) !== undefined;
    this.#input = new InputRequired({
      key: config.requestStateKey,
      ttlMs: config.requestStateTtlMs,
      sources: [
        new MissingArgumentsInput(stored),
        new ApprovalInput(mesh),
        ...(config.consentUrl === undefined ? [] : [new ConsentInput(config.consentUrl, stored)]),
      ],
    });
    if (config.requestStateKey === undefined)
      options.log.warn(
        "TOOLMESH_GATEWAY_REQUEST_STATE_KEY is unset: a retry answering input_required is taken only by this replica",
      );
    this.#legacy = createMcpServer(mesh, version, observe, "legacy", this.#input);
    // Connecting an in-process transport completes at once; requests wait for nothing.
    void this.#legacy.connect(this.#transport);
    this.http = createServer((req, res) => {
      res.setHeader("Keep-Alive", `timeout=${ADVERTISED_KEEP_ALIVE_S}`);
      void this.#route(req, res).catch((err: unknown) => {
        options.log.error({ err }, "gateway request failed");
        if (!res.headersSent) sendJson(res, 500, { error: "internal error" });
        else res.end();
      });
    });
    // Longer than the idle timeouts of clients and load balancers (60 s is common): a server that
    // closes an idle connection first races the client's next request on it (ECONNRESET). Clients
    // that follow the Keep-Alive header (Node's fetch keeps a socket until the advertised timeout
    // less 2 s) are told less than is kept, so a busy client's late reuse still finds it open.
    this.http.keepAliveTimeout = KEEP_ALIVE_MS;
    this.http.headersTimeout = KEEP_ALIVE_MS + 1_000;
  }

  listen(): Promise<number> {
    const { port, host } = this.#o.config;
    return new Promise((resolve, reject) => {
      this.http.once("error", reject);
      this.http.listen(port, host, () => {
        this.http.off("error", reject);
        resolve((this.http.address() as AddressInfo).port);
      });
    });
  }

  async close(): Promise<void> {
    const closing = new Promise<void>((resolve) => this.http.close(() => resolve()));
    for (const res of this.#streams) res.end();
    for (const { handler, stop } of this.#modern.values()) {
      stop();
      await handler.close();
    }
    await this.#legacy.close();
    this.http.closeAllConnections();
    await closing;
  }

  inFlight(): number {
    return this.#inFlight;
  }

  async #route(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = (req.url ?? "/").split("?", 1)[0] ?? "/";
    if (path === "/healthz") {
      const alive = this.#o.alive?.() ?? true;
      return sendJson(res, alive ? 200 : 503, { status: alive ? "ok" : "unavailable" });
    }
    if (path === "/readyz") return this.#readiness(res);
    if (path.startsWith("/.well-known/oauth-protected-resource"))
      return this.#resourceMetadata(req, res);
    const match = MCP_PATH.exec(path);
    if (match === null) return sendJson(res, 404, { error: "not found" });
    const admitted = await this.#edge(req, res, match[1]);
    if (admitted === undefined) return;
    if (req.method === "GET") {
      // A held-open stream is not a request in flight.
      admitted.release();
      return this.#openStream(res, admitted.scope);
    }
    if (req.method === "DELETE") {
      // Nothing to end: no session is kept.
      admitted.release();
      res.writeHead(200).end();
      return;
    }
    this.#inFlight += 1;
    const release = once(() => {
      this.#inFlight -= 1;
      admitted.release();
    });
    try {
      await this.#post(req, res, { ...admitted, release });
    } catch (err) {
      release();
      throw err;
    }
  }

  /** The edge checks; answers the client and returns undefined when one refuses. */
  async #edge(
    req: IncomingMessage,
    res: ServerResponse,
    agentInPath: string | undefined,
  ): Promise<Admitted | undefined> {
    const { config, auth } = this.#o;
    // Against DNS rebinding: a browser page may reach a local gateway, but it always sends its
    // Origin. No CORS headers are ever sent, so browsers keep cross-origin answers from pages.
    const origin = req.headers.origin;
    if (origin !== undefined && !config.allowedOrigins.includes(origin)) {
      sendJson(res, 403, rpcError(`origin ${origin} is not allowed`));
      return undefined;
    }
    let principal;
    try {
      principal = await auth.authenticate(req.headers.authorization);
    } catch (err) {
      if (!(err instanceof AuthError)) throw err;
      res.setHeader("WWW-Authenticate", this.#challenge(req, err));
      sendJson(res, err.status, rpcError(err.message));
      return undefined;
    }
    let agent: string | undefined = principal.agents?.[0];
    if (agentInPath !== undefined) {
      try {
        agent = decodeURIComponent(agentInPath);
      } catch {
        sendJson(res, 400, rpcError("the agent in the path is not valid URL encoding"));
        return undefined;
      }
      if (principal.agents !== undefined && !principal.agents.includes(agent)) {
        sendJson(res, 403, rpcError(`this credential may not use agent ${agent}`));
        return undefined;
      }
    }
    const names = namesOf(req, principal);
    if (names === undefined) {
      const valid = TOOL_NAMES.join(" or ");
      sendJson(res, 400, rpcError(`the names query parameter must be ${valid}`));
      return undefined;
    }
    if (!this.#acceptable(req, res)) return undefined;
    const admitted = await this.#admit(req, principal);
    if (typeof admitted !== "function") {
      res.setHeader("Retry-After", String(admitted.retryAfterS));
      const message =
        admitted.reason === "rate"
          ? "too many requests for this credential"
          : `more than ${config.maxConcurrent} requests in flight for this credential`;
      sendJson(res, 429, rpcError(message));
      return undefined;
    }
    const scope = { principal, agent, names, mcpSession: headerOf(req, "mcp-session-id") };
    return { scope, release: admitted };
  }

  /**
   * The credential's admission: this replica's limits, then, for a POST with mesh-wide limits,
   * the limits every replica shares (a stream held open is counted by its replica only).
   */
  async #admit(
    req: IncomingMessage,
    principal: { tenant: string; credential: string },
  ): Promise<(() => void) | LimitRefusal> {
    const local = this.#limits.enter(principal.credential);
    const shared = this.#o.meshLimits;
    if (typeof local !== "function" || shared === undefined || req.method !== "POST") return local;
    let mesh;
    try {
      mesh = await shared.enter(principal.tenant, principal.credential);
    } catch (err) {
      local();
      throw err;
    }
    if (typeof mesh !== "function") {
      local();
      return mesh;
    }
    return () => {
      local();
      mesh();
    };
  }

  /** The method and media-type checks of Streamable HTTP. */
  #acceptable(req: IncomingMessage, res: ServerResponse): boolean {
    if (req.method !== "POST" && req.method !== "GET" && req.method !== "DELETE") {
      res.setHeader("Allow", "GET, POST, DELETE");
      sendJson(res, 405, rpcError("method not allowed"));
      return false;
    }
    const accept = req.headers.accept ?? "";
    const post = req.method === "POST";
    if (!accept.includes("text/event-stream") || (post && !accept.includes("application/json"))) {
      const message = post
        ? "Not Acceptable: Client must accept both application/json and text/event-stream"
        : "Not Acceptable: Client must accept text/event-stream";
      sendJson(res, 406, rpcError(message));
      return false;
    }
    if (post && !isJsonContentType(req.headers["content-type"])) {
      sendJson(res, 415, rpcError("Unsupported Media Type: Content-Type must be application/json"));
      return false;
    }
    return true;
  }

  /** A POST: its body read once, then served by its era's leg. */
  async #post(req: IncomingMessage, res: ServerResponse, admitted: Admitted): Promise<void> {
    const read = await readBody(req, this.#o.config.maxBodyBytes);
    if (read.status !== 200) {
      admitted.release();
      return sendJson(res, read.status, rpcError(read.message));
    }
    const version = headerOf(req, "mcp-protocol-version");
    if (isModernRequest(version, read.body))
      return this.#serveModern(req, res, read.body, admitted);
    return this.#serveLegacy(req, res, read.body, admitted);
  }

  /** A 2026-07-28 request: one SDK server instance for this request, on the SDK's handler. */
  async #serveModern(
    req: IncomingMessage,
    res: ServerResponse,
    body: unknown,
    admitted: Admitted,
  ): Promise<void> {
    const aborted = new AbortController();
    res.on("close", () => {
      aborted.abort();
      admitted.release();
    });
    // What the SDK reads of a request: its media types and the MCP headers (the body is parsed).
    const headers = new Headers();
    for (const [name, value] of Object.entries(req.headers)) {
      if (typeof value !== "string") continue;
      if (name.startsWith("mcp-") || name === "accept" || name === "content-type")
        headers.set(name, value);
    }
    const url = `http://${req.headers.host ?? "gateway"}${req.url ?? "/mcp"}`;
    const request = new Request(url, { method: "POST", headers, signal: aborted.signal });
    await this.#traced(req, body, "mcp POST", admitted.scope.principal.tenant, async () => {
      const response = await this.#modernFor(admitted.scope.principal.tenant).fetch(request, {
        parsedBody: body,
        authInfo: requestAuthInfo(admitted.scope),
      });
      await writeWebResponse(response, res);
    });
    admitted.release();
  }

  /**
   * The 2026-07-28 handler of a tenant, made at its first modern request: its event bus carries
   * that tenant's tool-list changes to its `subscriptions/listen` streams, and no other tenant's.
   */
  #modernFor(tenant: string): McpHttpHandler {
    const known = this.#modern.get(tenant);
    if (known !== undefined) return known.handler;
    const { config, mesh, version, observe, log } = this.#o;
    const input = this.#input;
    const handler = createMcpHandler(
      () => createMcpServer(mesh, version, observe, "modern", input),
      {
        legacy: "reject",
        maxRequestBodySize: config.maxBodyBytes,
        onerror: (err) => log.debug({ err }, "2026-07-28 request refused"),
      },
    );
    const stop = this.#o.onToolsChanged(tenant, () => handler.notify.toolsChanged());
    this.#modern.set(tenant, { handler, stop });
    return handler;
  }

  /** 2025-era messages: handed to the process's legacy server, answered by one exchange. */
  #serveLegacy(req: IncomingMessage, res: ServerResponse, body: unknown, admitted: Admitted): void {
    const parsed = parseMessages(body);
    if (typeof parsed === "string") {
      admitted.release();
      return sendJson(res, 400, rpcError(parsed, -32700));
    }
    const { requests, notifications, batch } = parsed;
    const initializing = requests.some((r) => r.method === "initialize");
    const version = headerOf(req, "mcp-protocol-version");
    if (!initializing && version !== undefined && !SUPPORTED_PROTOCOL_VERSIONS.includes(version)) {
      admitted.release();
      const supported = SUPPORTED_PROTOCOL_VERSIONS.join(", ");
      const message = `Bad Request: Unsupported protocol version: ${version} (supported versions: ${supported})`;
      return sendJson(res, 400, rpcError(message));
    }
    const { scope } = admitted;
    if (initializing && scope.mcpSession === undefined) {
      // Stateless, but a session id gives request ids a namespace, so a cancellation sent to
      // another replica still names the call. Nothing is stored under it.
      res.setHeader("mcp-session-id", `gw-${randomUUID()}`);
    }
    for (const message of notifications) {
      // A cancellation names the client's request id, which the server never saw.
      if (message.method === "notifications/cancelled") {
        const requestId = (message.params as { requestId?: RequestId } | undefined)?.requestId;
        void cancelRequest(this.#o.mesh, scope, requestId);
      } else this.#transport.notification(message);
    }
    if (requests.length === 0) {
      admitted.release();
      res.writeHead(202).end();
      return;
    }
    // A JSON answer unless a request asks for progress: an event stream costs both sides more
    // (the server chooses, MCP 2025-03-26 "Sending Messages to the Server").
    const exchange = new LegacyExchange(res, requests, batch, requests.some(wantsProgress), (s) => {
      for (const id of s) this.#transport.abandon(id);
      admitted.release();
    });
    void this.#traced(
      req,
      body,
      `mcp ${req.method ?? ""}`,
      scope.principal.tenant,
      (span) => {
        exchange.bind(span);
        for (const request of requests)
          exchange.serving(
            this.#transport.request(request, requestAuthInfo(scope, request.id), exchange),
          );
        return Promise.resolve();
      },
      false,
    );
  }

  /**
   * Runs `serve` in the gateway's span, the root of the call's trace: under the caller's
   * `traceparent` header, or the one in the request's `_meta` (2026-07-28) when no header came.
   */
  #traced(
    req: IncomingMessage,
    body: unknown,
    name: string,
    tenant: string,
    serve: (span: Span) => Promise<void>,
    endSpan = true,
  ): Promise<void> {
    const carrier = req.headers.traceparent === undefined ? metaTraceContext(body) : undefined;
    const parent: Context = propagation.extract(ROOT_CONTEXT, carrier ?? req.headers);
    const attributes = {
      "toolmesh.tenant": tenant,
      "http.request.method": req.method ?? "",
    };
    return this.#o.tracer.startActiveSpan(
      name,
      { kind: SpanKind.SERVER, attributes },
      parent,
      async (span) => {
        try {
          await serve(span);
        } finally {
          if (endSpan) span.end();
        }
      },
    );
  }

  /** A `GET` stream: `tools/list_changed` for the caller's tenant until the client leaves. */
  #openStream(res: ServerResponse, scope: RequestScope): void {
    res.writeHead(200, {
      "content-type": "text/event-stream",
      "cache-control": "no-cache, no-transform",
      connection: "keep-alive",
    });
    res.flushHeaders();
    const unsubscribe = this.#o.onToolsChanged(scope.principal.tenant, () => {
      res.write(TOOLS_CHANGED);
    });
    this.#streams.add(res);
    res.on("close", () => {
      this.#streams.delete(res);
      unsubscribe();
    });
    this.#o.log.debug(
      { tenant: scope.principal.tenant, credential: scope.principal.credential },
      "tool-list stream opened",
    );
  }

  #readiness(res: ServerResponse): void {
    const ready = this.#o.ready();
    sendJson(res, ready.ok ? 200 : 503, {
      status: ready.ok ? "ready" : "unavailable",
      ...(ready.detail === undefined ? {} : { detail: ready.detail }),
    });
  }

  #resourceMetadata(req: IncomingMessage, res: ServerResponse): void {
    const { oauth } = this.#o.auth;
    if (oauth === undefined) return sendJson(res, 404, { error: "not found" });
    sendJson(res, 200, {
      resource: this.#resourceUrl(req),
      authorization_servers: oauth.authorizationServers,
      bearer_methods_supported: ["header"],
      ...(oauth.requiredScopes.length === 0 ? {} : { scopes_supported: oauth.requiredScopes }),
    });
  }

  #resourceUrl(req: IncomingMessage): string {
    const { config } = this.#o;
    if (config.resourceUrl !== undefined) return config.resourceUrl;
    return `http://${req.headers.host ?? `${config.host}:${config.port}`}/mcp`;
  }

  #challenge(req: IncomingMessage, err: AuthError): string {
    const { oauth } = this.#o.auth;
    const parts = [`realm="toolmesh"`];
    if (oauth !== undefined) {
      const base = new URL(this.#resourceUrl(req));
      parts.push(`resource_metadata="${base.origin}/.well-known/oauth-protected-resource"`);
      if (oauth.requiredScopes.length > 0) parts.push(`scope="${oauth.requiredScopes.join(" ")}"`);
    }
    if (err.code !== undefined) {
      parts.push(`error="${err.code}"`);
      parts.push(`error_description="${err.message.replace(/["\\]/g, "'")}"`);
    }
    return `Bearer ${parts.join(", ")}`;
  }
}

/** A function that runs its body the first time it is called, and never again. */
function once(fn: () => void): () => void {
  let done = false;
  return () => {
    if (done) return;
    done = true;
    fn();
  };
}
