import { randomUUID } from "node:crypto";
import { createServer } from "node:http";
import type { IncomingMessage, Server as HttpServer, ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import type {
  JSONRPCMessage,
  JSONRPCNotification,
  JSONRPCRequest,
  RequestId,
} from "@modelcontextprotocol/sdk/types.js";
import { SUPPORTED_PROTOCOL_VERSIONS } from "@modelcontextprotocol/sdk/types.js";
import type { Logger, Tracer } from "@toolmesh/telemetry";
import { SpanKind } from "@toolmesh/telemetry";
import { ROOT_CONTEXT, propagation } from "@opentelemetry/api";
import type { Authenticator, Principal } from "./auth.js";
import { AuthError } from "./auth.js";
import type { GatewayConfig } from "./config.js";
import { CredentialLimits } from "./limits.js";
import type { CallObserver, RequestScope } from "./mcp-server.js";
import { cancelRequest, createMcpServer, requestAuthInfo } from "./mcp-server.js";
import type { Exchange } from "./transport.js";
import { ExchangeTransport } from "./transport.js";
import type { MeshView } from "./mesh-view.js";

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
 * Builds the HTTP side of the gateway: `/mcp` (and `/mcp/agents/{agent}`) over the stateless
 * Streamable HTTP transport, `/readyz`, `/healthz` and the protected-resource metadata.
 */
export function createGatewayServer(options: GatewayServerOptions): GatewayServer {
  const { config, auth, log } = options;
  const limits = new CredentialLimits({
    maxConcurrent: config.maxConcurrent,
    ratePerS: config.ratePerS,
    burst: config.rateBurst,
  });
  const server = createMcpServer(options.mesh, options.version, options.observe);
  const transport = new ExchangeTransport();
  // Connecting an in-process transport completes at once; requests wait for nothing.
  void server.connect(transport);
  const streams = new Set<ServerResponse>();
  let inFlight = 0;

  const http = createServer((req, res) => {
    void route(req, res).catch((err: unknown) => {
      log.error({ err }, "gateway request failed");
      if (!res.headersSent) sendJson(res, 500, { error: "internal error" });
      else res.end();
    });
  });

  // Longer than the idle timeouts of clients and load balancers (60 s is common): a server that
  // closes an idle connection first races the client's next request on it (ECONNRESET).
  http.keepAliveTimeout = 65_000;
  http.headersTimeout = 66_000;

  async function route(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = (req.url ?? "/").split("?", 1)[0] ?? "/";
    if (path === "/healthz") {
      const alive = options.alive?.() ?? true;
      return sendJson(res, alive ? 200 : 503, { status: alive ? "ok" : "unavailable" });
    }
    if (path === "/readyz") {
      const ready = options.ready();
      return sendJson(res, ready.ok ? 200 : 503, {
        status: ready.ok ? "ready" : "unavailable",
        ...(ready.detail === undefined ? {} : { detail: ready.detail }),
      });
    }
    if (path.startsWith("/.well-known/oauth-protected-resource")) {
      if (auth.oauth === undefined) return sendJson(res, 404, { error: "not found" });
      return sendJson(res, 200, {
        resource: resourceUrl(req),
        authorization_servers: auth.oauth.authorizationServers,
        bearer_methods_supported: ["header"],
        ...(auth.oauth.requiredScopes.length === 0
          ? {}
          : { scopes_supported: auth.oauth.requiredScopes }),
      });
    }
    const match = MCP_PATH.exec(path);
    if (match === null) return sendJson(res, 404, { error: "not found" });

    // Against DNS rebinding: a browser page may reach a local gateway, but it always sends its
    // Origin. No CORS headers are ever sent, so browsers keep cross-origin answers from pages.
    const origin = req.headers.origin;
    if (origin !== undefined && !config.allowedOrigins.includes(origin)) {
      return sendJson(res, 403, rpcError(`origin ${origin} is not allowed`));
    }

    let principal: Principal;
    try {
      principal = await auth.authenticate(req.headers.authorization);
    } catch (err) {
      if (!(err instanceof AuthError)) throw err;
      res.setHeader("WWW-Authenticate", challenge(req, err));
      return sendJson(res, err.status, rpcError(err.message));
    }

    let agent: string | undefined;
    if (match[1] !== undefined) {
      try {
        agent = decodeURIComponent(match[1]);
      } catch {
        return sendJson(res, 400, rpcError("the agent in the path is not valid URL encoding"));
      }
      if (principal.agents !== undefined && !principal.agents.includes(agent))
        return sendJson(res, 403, rpcError(`this credential may not use agent ${agent}`));
    } else agent = principal.agents?.[0];

    if (req.method !== "POST" && req.method !== "GET" && req.method !== "DELETE") {
      res.setHeader("Allow", "GET, POST, DELETE");
      return sendJson(res, 405, rpcError("method not allowed"));
    }
    const accept = req.headers.accept ?? "";
    if (
      !accept.includes("text/event-stream") ||
      (req.method === "POST" && !accept.includes("application/json"))
    ) {
      return sendJson(
        res,
        406,
        rpcError(
          req.method === "POST"
            ? "Not Acceptable: Client must accept both application/json and text/event-stream"
            : "Not Acceptable: Client must accept text/event-stream",
        ),
      );
    }
    if (req.method === "POST" && !isJsonContentType(req.headers["content-type"])) {
      return sendJson(
        res,
        415,
        rpcError("Unsupported Media Type: Content-Type must be application/json"),
      );
    }

    const isStream = req.method === "GET";
    const admitted = limits.enter(principal.credential);
    if (typeof admitted !== "function") {
      res.setHeader("Retry-After", String(admitted.retryAfterS));
      return sendJson(
        res,
        429,
        rpcError(
          admitted.reason === "rate"
            ? "too many requests for this credential"
            : `more than ${config.maxConcurrent} requests in flight for this credential`,
        ),
      );
    }
    // A held-open stream is not a request in flight.
    if (isStream) admitted();

    let requests: JSONRPCRequest[] = [];
    let notifications: JSONRPCNotification[] = [];
    let batch = false;
    if (req.method === "POST") {
      const read = await readBody(req, config.maxBodyBytes);
      if (read.status !== 200) {
        admitted();
        return sendJson(res, read.status, rpcError(read.message));
      }
      const parsed = parseMessages(read.body);
      if (typeof parsed === "string") {
        admitted();
        return sendJson(res, 400, rpcError(parsed, -32700));
      }
      ({ requests, notifications, batch } = parsed);
    }

    const initializing = requests.some((r) => r.method === "initialize");
    if (!initializing) {
      const version = headerOf(req, "mcp-protocol-version");
      if (version !== undefined && !SUPPORTED_PROTOCOL_VERSIONS.includes(version)) {
        admitted();
        return sendJson(
          res,
          400,
          rpcError(
            `Bad Request: Unsupported protocol version: ${version} (supported versions: ${SUPPORTED_PROTOCOL_VERSIONS.join(", ")})`,
          ),
        );
      }
    }
    const mcpSession = headerOf(req, "mcp-session-id");
    const scope: RequestScope = { principal, agent, mcpSession };

    if (req.method === "DELETE") {
      // Nothing to end: no session is kept.
      admitted();
      res.writeHead(200).end();
      return;
    }
    if (isStream) return openStream(res, scope);
    if (initializing && mcpSession === undefined) {
      // Stateless, but a session id gives request ids a namespace, so a cancellation sent to
      // another replica still names the call. Nothing is stored under it.
      res.setHeader("mcp-session-id", `gw-${randomUUID()}`);
    }

    for (const message of notifications) {
      // A cancellation names the client's request id, which the server never saw.
      if (message.method === "notifications/cancelled") {
        const requestId = (message.params as { requestId?: RequestId } | undefined)?.requestId;
        void cancelRequest(options.mesh, scope, requestId);
      } else transport.notification(message);
    }
    if (requests.length === 0) {
      admitted();
      res.writeHead(202).end();
      return;
    }

    // A JSON answer unless a request asks for progress: an event stream costs both sides more
    // (the server chooses, MCP 2025-03-26 "Sending Messages to the Server").
    const events = requests.some(wantsProgress);
    inFlight += 1;
    const answers = new Map<RequestId, JSONRPCMessage>();
    const served: number[] = [];
    let ended = false;
    let endSpan: (() => void) | undefined;
    const end = (): void => {
      if (ended) return;
      ended = true;
      inFlight -= 1;
      admitted();
      for (const id of served) transport.abandon(id);
      endSpan?.();
    };
    res.on("close", end);
    if (events) {
      res.writeHead(200, {
        "content-type": "text/event-stream",
        "cache-control": "no-cache, no-transform",
        connection: "keep-alive",
      });
      res.flushHeaders();
    }
    const exchange: Exchange = {
      notify(message) {
        if (events && !ended) res.write(sseEvent(message));
      },
      answer(message) {
        if (ended) return;
        answers.set((message as { id: RequestId }).id, message);
        if (events) res.write(sseEvent(message));
        if (answers.size < requests.length) return;
        if (events) res.end();
        else {
          const body = batch
            ? requests.map((r) => answers.get(r.id))
            : answers.get(requests[0]!.id);
          sendJson(res, 200, body);
        }
        end();
      },
    };
    // The gateway's span is the root of the call's trace, under the caller's traceparent if any.
    const parent = propagation.extract(ROOT_CONTEXT, req.headers);
    options.tracer.startActiveSpan(
      `mcp ${req.method ?? ""}`,
      {
        kind: SpanKind.SERVER,
        attributes: {
          "toolmesh.tenant": principal.tenant,
          "http.request.method": req.method ?? "",
        },
      },
      parent,
      (span) => {
        endSpan = () => span.end();
        for (const request of requests) {
          const authInfo = requestAuthInfo({ scope, requestId: request.id });
          served.push(transport.request(request, principal.tenant, authInfo, exchange));
        }
      },
    );
  }

  /** A `GET` stream: `tools/list_changed` for the caller's tenant until the client leaves. */
  function openStream(res: ServerResponse, scope: RequestScope): void {
    res.writeHead(200, {
      "content-type": "text/event-stream",
      "cache-control": "no-cache, no-transform",
      connection: "keep-alive",
    });
    res.flushHeaders();
    const unsubscribe = options.onToolsChanged(scope.principal.tenant, () => {
      res.write(TOOLS_CHANGED);
    });
    streams.add(res);
    res.on("close", () => {
      streams.delete(res);
      unsubscribe();
    });
    log.debug(
      { tenant: scope.principal.tenant, credential: scope.principal.credential },
      "tool-list stream opened",
    );
  }

  function resourceUrl(req: IncomingMessage): string {
    if (config.resourceUrl !== undefined) return config.resourceUrl;
    return `http://${req.headers.host ?? `${config.host}:${config.port}`}/mcp`;
  }

  function challenge(req: IncomingMessage, err: AuthError): string {
    const parts = [`realm="toolmesh"`];
    if (auth.oauth !== undefined) {
      const base = new URL(resourceUrl(req));
      parts.push(`resource_metadata="${base.origin}/.well-known/oauth-protected-resource"`);
      if (auth.oauth.requiredScopes.length > 0)
        parts.push(`scope="${auth.oauth.requiredScopes.join(" ")}"`);
    }
    if (err.code !== undefined) {
      parts.push(`error="${err.code}"`);
      parts.push(`error_description="${err.message.replace(/["\\]/g, "'")}"`);
    }
    return `Bearer ${parts.join(", ")}`;
  }

  return {
    http,
    listen() {
      return new Promise((resolve, reject) => {
        http.once("error", reject);
        http.listen(config.port, config.host, () => {
          http.off("error", reject);
          resolve((http.address() as AddressInfo).port);
        });
      });
    },
    async close() {
      const closing = new Promise<void>((resolve) => http.close(() => resolve()));
      for (const res of streams) res.end();
      await server.close();
      http.closeAllConnections();
      await closing;
    },
    inFlight: () => inFlight,
  };
}

/** Whether a POST body holds a synchronous `tools/call` with a progress token. */
function wantsProgress(body: unknown): boolean {
  if (Array.isArray(body)) return body.some(wantsProgress);
  if (typeof body !== "object" || body === null) return false;
  const message = body as { method?: unknown; params?: { task?: unknown; _meta?: unknown } };
  if (message.method !== "tools/call" || message.params?.task !== undefined) return false;
  const meta = message.params?._meta;
  return typeof meta === "object" && meta !== null && "progressToken" in meta;
}

function headerOf(req: IncomingMessage, name: string): string | undefined {
  const value = req.headers[name];
  return typeof value === "string" && value !== "" ? value : undefined;
}

function rpcError(message: string, code = -32000): unknown {
  return { jsonrpc: "2.0", error: { code, message }, id: null };
}

const TOOLS_CHANGED = sseEvent({ jsonrpc: "2.0", method: "notifications/tools/list_changed" });

function sseEvent(message: JSONRPCMessage): string {
  return `event: message\ndata: ${JSON.stringify(message)}\n\n`;
}

/** Whether a `Content-Type` is JSON (the media type itself, not a substring). */
function isJsonContentType(value: string | undefined): boolean {
  return value?.split(";")[0]?.trim().toLowerCase() === "application/json";
}

/**
 * The requests and notifications of a POST body (one message, or a batch of at most 100), or
 * what is wrong. Only the envelope is checked here: the server validates each request's params
 * against its method's schema. Responses are dropped: the gateway never asks clients anything.
 */
function parseMessages(
  body: unknown,
): { requests: JSONRPCRequest[]; notifications: JSONRPCNotification[]; batch: boolean } | string {
  const batch = Array.isArray(body);
  const raw: unknown[] = batch ? body : [body];
  if (raw.length === 0 || raw.length > MAX_BATCH) return `a batch holds 1 to ${MAX_BATCH} messages`;
  const requests: JSONRPCRequest[] = [];
  const notifications: JSONRPCNotification[] = [];
  for (const item of raw) {
    const message = item as Partial<Record<"jsonrpc" | "method" | "id" | "params", unknown>>;
    const invalid = "Parse error: Invalid JSON-RPC message";
    if (typeof item !== "object" || item === null || message.jsonrpc !== "2.0") return invalid;
    if (
      message.params !== undefined &&
      (typeof message.params !== "object" || message.params === null)
    )
      return invalid;
    const hasId = typeof message.id === "string" || Number.isInteger(message.id);
    if (message.id !== undefined && !hasId) return invalid;
    if (typeof message.method === "string") {
      if (hasId) requests.push(item as JSONRPCRequest);
      else notifications.push(item as JSONRPCNotification);
    } else if (!hasId || !("result" in message || "error" in message)) return invalid;
  }
  return { requests, notifications, batch };
}

const MAX_BATCH = 100;

function sendJson(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(text),
  });
  res.end(text);
}

/** Reads a JSON body of at most `limit` bytes. */
async function readBody(
  req: IncomingMessage,
  limit: number,
): Promise<{ status: 200; body: unknown } | { status: 400 | 413; message: string }> {
  const declared = Number(req.headers["content-length"] ?? "0");
  const tooLarge = {
    status: 413 as const,
    message: `request body over ${limit} bytes (TOOLMESH_GATEWAY_MAX_BODY_BYTES)`,
  };
  if (declared > limit) {
    req.resume();
    return tooLarge;
  }
  // Listeners rather than an async iterator: cheaper for the small bodies of most requests.
  const chunks: Buffer[] = [];
  const complete = await new Promise<boolean>((resolve, reject) => {
    let size = 0;
    const onData = (chunk: Buffer): void => {
      size += chunk.length;
      if (size <= limit) {
        chunks.push(chunk);
        return;
      }
      req.off("data", onData).off("end", onEnd).off("error", reject);
      req.resume(); // drain what is still coming
      resolve(false);
    };
    const onEnd = (): void => resolve(true);
    req.on("data", onData).once("end", onEnd).once("error", reject);
  });
  if (!complete) return tooLarge;
  try {
    return { status: 200, body: JSON.parse(Buffer.concat(chunks).toString("utf8")) as unknown };
  } catch {
    return { status: 400, message: "the request body is not JSON" };
  }
}
