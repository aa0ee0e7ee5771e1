import { randomUUID } from "node:crypto";
import { createServer } from "node:http";
import type { IncomingMessage, Server as HttpServer, ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import type { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { isInitializeRequest } from "@modelcontextprotocol/sdk/types.js";
import type { Logger, Tracer } from "@toolmesh/telemetry";
import { SpanKind } from "@toolmesh/telemetry";
import { ROOT_CONTEXT, propagation } from "@opentelemetry/api";
import type { Authenticator, Principal } from "./auth.js";
import { AuthError } from "./auth.js";
import type { GatewayConfig } from "./config.js";
import { CredentialLimits } from "./limits.js";
import type { CallObserver } from "./mcp-server.js";
import { createMcpServer } from "./mcp-server.js";
import type { MeshView } from "./mesh-view.js";

/** What {@link createGatewayServer} needs. */
export interface GatewayServerOptions {
  config: GatewayConfig;
  auth: Authenticator;
  mesh: MeshView;
  log: Logger;
  tracer: Tracer;
  version: string;
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
  const open = new Set<Server>();
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
    const url = new URL(req.url ?? "/", "http://gateway");
    if (url.pathname === "/healthz") return sendJson(res, 200, { status: "ok" });
    if (url.pathname === "/readyz") {
      const ready = options.ready();
      return sendJson(res, ready.ok ? 200 : 503, {
        status: ready.ok ? "ready" : "unavailable",
        ...(ready.detail === undefined ? {} : { detail: ready.detail }),
      });
    }
    if (url.pathname.startsWith("/.well-known/oauth-protected-resource")) {
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
    const match = MCP_PATH.exec(url.pathname);
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

    let body: unknown;
    if (req.method === "POST") {
      const read = await readBody(req, config.maxBodyBytes);
      if (read.status !== 200) {
        admitted();
        return sendJson(res, read.status, rpcError(read.message));
      }
      body = read.body;
    }

    const mcpSession = headerOf(req, "mcp-session-id");
    if (req.method === "POST" && isInitializeRequest(body) && mcpSession === undefined) {
      // Stateless, but a session id gives request ids a namespace, so a cancellation sent to
      // another replica still names the call. Nothing is stored under it.
      res.setHeader("mcp-session-id", `gw-${randomUUID()}`);
    }

    const server = createMcpServer(
      options.mesh,
      { principal, agent, mcpSession },
      options.version,
      options.observe,
    );
    const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined });
    open.add(server);
    inFlight += isStream ? 0 : 1;
    let unsubscribe: (() => void) | undefined;
    let closed = false;
    const finish = (): void => {
      if (closed) return;
      closed = true;
      open.delete(server);
      unsubscribe?.();
      if (!isStream) {
        inFlight -= 1;
        admitted();
      }
      void server.close().catch(() => undefined);
    };
    res.on("close", finish);
    if (isStream) {
      unsubscribe = options.onToolsChanged(principal.tenant, () => {
        void server.sendToolListChanged().catch(() => undefined);
      });
      log.debug(
        { tenant: principal.tenant, credential: principal.credential },
        "tool-list stream opened",
      );
    }
    // The gateway's span is the root of the call's trace, under the caller's traceparent if any.
    const parent = propagation.extract(ROOT_CONTEXT, req.headers);
    await options.tracer.startActiveSpan(
      `mcp ${req.method ?? ""}`,
      {
        kind: SpanKind.SERVER,
        attributes: {
          "toolmesh.tenant": principal.tenant,
          "http.request.method": req.method ?? "",
        },
      },
      parent,
      async (span) => {
        try {
          await server.connect(transport);
          await transport.handleRequest(req, res, body);
        } finally {
          span.end();
        }
      },
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
      await Promise.all([...open].map((s) => s.close().catch(() => undefined)));
      http.closeAllConnections();
      await closing;
    },
    inFlight: () => inFlight,
  };
}

function headerOf(req: IncomingMessage, name: string): string | undefined {
  const value = req.headers[name];
  return typeof value === "string" && value !== "" ? value : undefined;
}

function rpcError(message: string): unknown {
  return { jsonrpc: "2.0", error: { code: -32000, message }, id: null };
}

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
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    const buffer = chunk as Buffer;
    size += buffer.length;
    if (size > limit) {
      req.resume();
      return tooLarge;
    }
    chunks.push(buffer);
  }
  try {
    return { status: 200, body: JSON.parse(Buffer.concat(chunks).toString("utf8")) as unknown };
  } catch {
    return { status: 400, message: "the request body is not JSON" };
  }
}
