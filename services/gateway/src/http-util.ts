import type { IncomingMessage, ServerResponse } from "node:http";
import type {
  JSONRPCMessage,
  JSONRPCNotification,
  JSONRPCRequest,
} from "@modelcontextprotocol/server";

/** Whether a POST body holds a synchronous `tools/call` with a progress token. */
export function wantsProgress(body: unknown): boolean {
  if (Array.isArray(body)) return body.some(wantsProgress);
  if (typeof body !== "object" || body === null) return false;
  const message = body as { method?: unknown; params?: { task?: unknown; _meta?: unknown } };
  if (message.method !== "tools/call" || message.params?.task !== undefined) return false;
  const meta = message.params?._meta;
  return typeof meta === "object" && meta !== null && "progressToken" in meta;
}

export function headerOf(req: IncomingMessage, name: string): string | undefined {
  const value = req.headers[name];
  return typeof value === "string" && value !== "" ? value : undefined;
}

export function rpcError(message: string, code = -32000): unknown {
  return { jsonrpc: "2.0", error: { code, message }, id: null };
}

export const TOOLS_CHANGED = sseEvent({
  jsonrpc: "2.0",
  method: "notifications/tools/list_changed",
});

export function sseEvent(message: JSONRPCMessage): string {
  return `event: message\ndata: ${JSON.stringify(message)}\n\n`;
}

/** Whether a `Content-Type` is JSON (the media type itself, not a substring). */
export function isJsonContentType(value: string | undefined): boolean {
  return value?.split(";")[0]?.trim().toLowerCase() === "application/json";
}

/**
 * The requests and notifications of a POST body (one message, or a batch of at most 100), or
 * what is wrong. Only the envelope is checked here: the server validates each request's params
 * against its method's schema. Responses are dropped: the gateway never asks clients anything.
 */
export function parseMessages(
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

export function sendJson(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(text),
  });
  res.end(text);
}

/** Reads a JSON body of at most `limit` bytes. */
export async function readBody(
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

/** The `_meta` key of a 2026-07-28 request's protocol version (its per-request envelope). */
const PROTOCOL_VERSION_META = "io.modelcontextprotocol/protocolVersion";

/**
 * Whether a request belongs to the 2026-07-28 era: a message carries the per-request envelope,
 * or the `MCP-Protocol-Version` header names a revision that has no `initialize`. Such requests
 * go to the SDK's modern leg, whose validation answers a malformed envelope or a header that
 * disagrees with the body; everything else is a 2025-era request.
 */
export function isModernRequest(version: string | undefined, body: unknown): boolean {
  if (version !== undefined && version >= "2026-07-28") return true;
  const messages: unknown[] = Array.isArray(body) ? body : [body];
  return messages.some((message) => {
    const meta = (message as { params?: { _meta?: unknown } } | null)?.params?._meta;
    return typeof meta === "object" && meta !== null && PROTOCOL_VERSION_META in meta;
  });
}

/** The W3C trace context a request carries in `_meta` (2026-07-28), if any. */
export function metaTraceContext(body: unknown): Record<string, string> | undefined {
  const first: unknown = Array.isArray(body) ? body[0] : body;
  const meta = (first as { params?: { _meta?: Record<string, unknown> } } | null)?.params?._meta;
  const traceparent = meta?.traceparent;
  if (typeof traceparent !== "string") return undefined;
  const tracestate = meta?.tracestate;
  return typeof tracestate === "string" ? { traceparent, tracestate } : { traceparent };
}

/** Writes a web `Response` to a Node response, streaming its body as it comes. */
export async function writeWebResponse(response: Response, res: ServerResponse): Promise<void> {
  const headers: Record<string, string> = {};
  response.headers.forEach((value, name) => {
    headers[name] = value;
  });
  res.writeHead(response.status, headers);
  if (response.body === null) {
    res.end();
    return;
  }
  if (!response.headers.get("content-type")?.startsWith("text/event-stream")) {
    // One JSON body: read at once, cheaper than iterating a web stream.
    res.end(Buffer.from(await response.arrayBuffer()));
    return;
  }
  res.flushHeaders();
  try {
    // Leaving the loop cancels the stream (the client went away).
    for await (const chunk of response.body as unknown as AsyncIterable<Uint8Array>) {
      if (res.destroyed) break;
      res.write(chunk);
    }
  } finally {
    res.end();
  }
}
