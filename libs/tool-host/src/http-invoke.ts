import { ErrorCode, RetryableError, TerminalError, ToolmeshError } from "@toolmesh/protocol";
import { injectTraceHeaders } from "@toolmesh/telemetry";
import type { FetchLike } from "./outbound.js";
import { privateAddressCause, privateAddressDenied } from "./outbound.js";
import type { ToolContext } from "./tool-module.js";

const REDIRECTS = new Set([301, 302, 303, 307, 308]);
const MAX_REDIRECTS = 5;
/** Bytes of an error response's body kept in the error's details. */
export const ERROR_BODY_BYTES = 4096;
const REDACTED = "[redacted]";

/**
 * URL prefixes an HTTP tool may call (`TOOLMESH_NATIVE_ALLOWED_URLS`): same origin, and the
 * path equal to the prefix's or under it (segment-wise).
 */
export class UrlAllowList {
  readonly #prefixes: readonly { origin: string; path: string }[];

  constructor(prefixes: readonly string[]) {
    this.#prefixes = prefixes.map((p) => {
      const url = new URL(p);
      return { origin: url.origin, path: url.pathname };
    });
  }

  /** Whether `url` is under one of the prefixes. */
  allows(url: URL): boolean {
    return this.#prefixes.some(
      (p) =>
        url.origin === p.origin &&
        (p.path.endsWith("/")
          ? url.pathname.startsWith(p.path)
          : url.pathname === p.path || url.pathname.startsWith(`${p.path}/`)),
    );
  }
}

/** What stays the same for every request of one HTTP tool, compiled once at load. */
export interface HttpEndpoint {
  /** The tool's name, for messages. */
  readonly tool: string;
  /** URL prefixes it may reach, checked for the first request and every redirect. Undefined: any. */
  readonly allowed: UrlAllowList | undefined;
  /** Header names carrying credentials: dropped when a redirect leaves the origin. */
  readonly credentialHeaders: readonly string[];
  /** Secret values never carried into results, errors or logs (replaced by `[redacted]`). */
  readonly secrets: readonly string[];
  /** Largest successful response body accepted, in bytes. */
  readonly maxResponseBytes: number;
  /** The guarded fetch ({@link outboundFetch}). */
  readonly fetch: FetchLike;
}

/** One request as a tool built it from its arguments. */
export interface HttpRequest {
  method: string;
  url: URL;
  headers: Headers;
  body?: string | undefined;
}

/** The `Accept` header HTTP tools send unless they set their own. */
export const DEFAULT_ACCEPT = "application/json, text/*;q=0.9, */*;q=0.8";

/**
 * Sends one request of an HTTP tool (one attempt) and turns the answer into a result or a
 * typed error: redirects followed here, each hop checked against the allow-list and the
 * credential headers dropped across origins; a 2xx JSON body is the parsed result, other 2xx
 * bodies text; 429 and 5xx are retryable (honouring `Retry-After`), other statuses terminal,
 * each with `status` and an excerpt of the body in the details; an unreachable host is a
 * retryable `unavailable`, a private address `permission_denied`. The trace context goes in
 * the request's headers.
 */
export async function invokeHttp(
  endpoint: HttpEndpoint,
  request: HttpRequest,
  ctx: ToolContext,
): Promise<unknown> {
  const { headers } = request;
  injectTraceHeaders({ get: (k) => headers.get(k) ?? "", set: (k, v) => headers.set(k, v) });
  const started = performance.now();
  const { response, url, method } = await fetchFollowingRedirects(endpoint, request, ctx);
  ctx.log.debug(
    {
      method,
      host: url.host,
      status: response.status,
      duration_ms: Math.round((performance.now() - started) * 1000) / 1000,
    },
    "HTTP tool request answered",
  );
  return outcomeOf(endpoint, response, url, ctx);
}

/**
 * Sends the request and follows its redirects, checking every hop against the allow-list and
 * dropping the credential headers (from `request.headers`) when a hop leaves the origin: the
 * final response, and the URL and method that got it.
 */
async function fetchFollowingRedirects(
  endpoint: HttpEndpoint,
  request: HttpRequest,
  ctx: ToolContext,
): Promise<{ response: Response; url: URL; method: string }> {
  const { headers } = request;
  let { url, body, method } = request;
  let response: Response;
  for (let hop = 0; ; hop++) {
    if (endpoint.allowed !== undefined && !endpoint.allowed.allows(url)) {
      throw new ToolmeshError(
        ErrorCode.PermissionDenied,
        `"${endpoint.tool}" may not call ${url.origin}${hop === 0 ? "" : " (redirected)"}: the URL is outside TOOLMESH_NATIVE_ALLOWED_URLS`,
        { retryable: false, details: { origin: url.origin } },
      );
    }
    try {
      response = await endpoint.fetch(url, {
        method,
        headers,
        ...(body === undefined ? {} : { body }),
        signal: ctx.signal,
        // Followed here, so every hop passes the allow-list and credentials stay on their origin.
        redirect: "manual",
      });
    } catch (err) {
      throw unreachable(endpoint, url, err, ctx);
    }
    const location = response.headers.get("location");
    if (!REDIRECTS.has(response.status) || location === null) break;
    await response.body?.cancel().catch(() => undefined);
    if (hop >= MAX_REDIRECTS) {
      throw new TerminalError(
        `"${endpoint.tool}" was redirected more than ${MAX_REDIRECTS} times`,
        { details: { status: response.status } },
      );
    }
    const next = URL.canParse(location, url.href) ? new URL(location, url) : undefined;
    if (next === undefined || (next.protocol !== "http:" && next.protocol !== "https:")) {
      throw new TerminalError(`"${endpoint.tool}" was redirected to an unusable location`, {
        details: { status: response.status },
      });
    }
    if (next.origin !== url.origin) {
      for (const name of endpoint.credentialHeaders) headers.delete(name);
    }
    if (
      response.status === 303 ||
      (response.status !== 307 && response.status !== 308 && method === "POST")
    ) {
      method = "GET";
      body = undefined;
      headers.delete("content-type");
    }
    url = next;
  }
  return { response, url, method };
}

/**
 * What the final response means: a 2xx body is the result (too large a one is
 * `payload_too_large`); 429 and 5xx are retryable, other statuses terminal, with an excerpt of
 * the body in the error's details.
 */
async function outcomeOf(
  endpoint: HttpEndpoint,
  response: Response,
  url: URL,
  ctx: ToolContext,
): Promise<unknown> {
  const status = response.status;
  if (status >= 200 && status < 300) {
    const { text, truncated } = await readBody(
      response,
      endpoint.maxResponseBytes,
      endpoint,
      url,
      ctx,
    );
    if (truncated) {
      throw new ToolmeshError(
        ErrorCode.PayloadTooLarge,
        `"${endpoint.tool}" answered more than ${endpoint.maxResponseBytes} bytes`,
        { retryable: false, details: { limit: endpoint.maxResponseBytes } },
      );
    }
    return resultOf(redact(text, endpoint), response.headers.get("content-type"));
  }
  const excerpt = await readBody(response, ERROR_BODY_BYTES, endpoint, url, ctx);
  const details: Record<string, unknown> = {
    status,
    body: redact(excerpt.text, endpoint),
    ...(excerpt.truncated ? { body_truncated: true } : {}),
  };
  if (status === 429 || status >= 500) {
    const retryAfter = retryAfterMs(response.headers.get("retry-after"));
    throw new RetryableError(`"${endpoint.tool}" answered HTTP ${status}`, {
      ...(retryAfter === undefined ? {} : { retryAfterMs: retryAfter }),
      details: retryAfter === undefined ? details : { ...details, retry_after_ms: retryAfter },
    });
  }
  throw new TerminalError(`"${endpoint.tool}" answered HTTP ${status}`, { details });
}

/**
 * Milliseconds a `Retry-After` header asks to wait: delay-seconds or an HTTP date (RFC 9110
 * §10.2.3). Undefined when absent or unreadable; never negative.
 */
export function retryAfterMs(value: string | null, now = Date.now()): number | undefined {
  if (value === null) return undefined;
  const text = value.trim();
  if (/^\d+$/.test(text)) return Number(text) * 1000;
  const at = Date.parse(text);
  return Number.isNaN(at) ? undefined : Math.max(0, at - now);
}

/** Reads at most `limit` bytes of the body as UTF-8; `truncated` when there was more. */
async function readBody(
  response: Response,
  limit: number,
  endpoint: HttpEndpoint,
  url: URL,
  ctx: ToolContext,
): Promise<{ text: string; truncated: boolean }> {
  if (response.body === null) return { text: "", truncated: false };
  const reader = (response.body as ReadableStream<Uint8Array>).getReader();
  const decoder = new TextDecoder();
  let text = "";
  let bytes = 0;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return { text: text + decoder.decode(), truncated: false };
      if (bytes + value.byteLength > limit) {
        text += decoder.decode(value.subarray(0, limit - bytes), { stream: true });
        await reader.cancel().catch(() => undefined);
        return { text, truncated: true };
      }
      bytes += value.byteLength;
      text += decoder.decode(value, { stream: true });
    }
  } catch (err) {
    throw unreachable(endpoint, url, err, ctx);
  } finally {
    reader.releaseLock();
  }
}

/** JSON bodies as parsed JSON (so the content is JSON text); anything else as text. */
function resultOf(text: string, contentType: string | null): unknown {
  const mediaType = (contentType ?? "").split(";", 1)[0]?.trim().toLowerCase() ?? "";
  if (text.trim() === "" || !(mediaType === "application/json" || mediaType.endsWith("+json"))) {
    return text;
  }
  try {
    const value: unknown = JSON.parse(text);
    // Strings and null would lose their JSON form in the tool message's content.
    return typeof value === "string" || value === null ? JSON.stringify(value) : value;
  } catch {
    return text;
  }
}

/** The server echoing a credential back must not carry it into results, errors or logs. */
function redact(text: string, endpoint: HttpEndpoint): string {
  let out = text;
  for (const secret of endpoint.secrets) {
    if (secret.length >= 4) out = out.split(secret).join(REDACTED);
  }
  return out;
}

/**
 * A failure to reach the API (or to read its answer): retryable `unavailable`; an address
 * the tool may not reach is `permission_denied`.
 */
function unreachable(endpoint: HttpEndpoint, url: URL, err: unknown, ctx: ToolContext): unknown {
  // An aborted attempt is reported by the executor from the signal's reason.
  if (ctx.signal.aborted) return err;
  const refused = privateAddressCause(err);
  if (refused !== undefined) return privateAddressDenied(endpoint.tool, url.origin, refused);
  const cause = (err as { cause?: { code?: unknown; message?: unknown } }).cause;
  const reason =
    typeof cause?.code === "string"
      ? cause.code
      : typeof cause?.message === "string"
        ? cause.message
        : (err as Error).message;
  return new ToolmeshError(
    ErrorCode.Unavailable,
    `"${endpoint.tool}" cannot reach ${url.origin}: ${reason}`,
    { retryable: true, details: { origin: url.origin, reason }, cause: err },
  );
}

/** The `invalid_parameters` error of one argument that cannot go where the API wants it. */
export function invalidParameter(name: string, problem: string): ToolmeshError {
  return new ToolmeshError(ErrorCode.InvalidParameters, `parameter "${name}" ${problem}`, {
    retryable: false,
    details: {
      errors: [{ path: `/${name.replaceAll("~", "~0").replaceAll("/", "~1")}`, message: problem }],
    },
  });
}

/**
 * `template` with each `{name}` that `placeholder` matches replaced by its value (already
 * encoded); `invalid_parameters` naming the first placeholder without one.
 */
export function fillPath(
  template: string,
  placeholder: RegExp,
  values: ReadonlyMap<string, string>,
): string {
  let missing: string | undefined;
  const filled = template.replace(placeholder, (_, name: string) => {
    const value = values.get(name);
    if (value === undefined) missing ??= name;
    return value ?? "";
  });
  if (missing !== undefined) throw invalidParameter(missing, "is required: the URL path holds it");
  return filled;
}

/**
 * Gives a request that may have a side effect the call's idempotency key, unless the arguments
 * set one: the API can then make the effect exactly-once across retries and redeliveries.
 */
export function setIdempotencyKey(headers: Headers, method: string, key: string): void {
  if (method !== "GET" && method !== "HEAD" && !headers.has("idempotency-key"))
    headers.set("idempotency-key", key);
}

/** A value as it goes into a URL or a header: strings as they are, the rest as JSON. */
export function textOf(value: unknown): string {
  if (typeof value === "string") return value;
  if (typeof value === "number" || typeof value === "boolean" || typeof value === "bigint") {
    return String(value);
  }
  return JSON.stringify(value) ?? "";
}
