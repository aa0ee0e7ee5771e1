import { isDeepStrictEqual } from "node:util";
import {
  ProtocolError,
  ProtocolErrorCode,
  SdkError,
  SdkErrorCode,
  SdkHttpError,
  SseError,
  UnauthorizedError,
} from "@modelcontextprotocol/client";
import type { CallToolResult } from "@modelcontextprotocol/client";
import { ErrorCode, ToolmeshError } from "@toolmesh/protocol";
import { privateAddressCause } from "@toolmesh/tool-host";

/** Longest error text taken from a server's content into an error message, in characters. */
const MAX_MESSAGE_CHARS = 500;

/**
 * Which form of a result with `structuredContent` reaches the model (the server option
 * `structured_content`):
 *
 * - `auto`: the text when the structured content only repeats it (the same JSON, or an
 *   object holding nothing but that text, as server-filesystem's `{content: text}`); both
 *   otherwise;
 * - `content`: the content blocks only, `structuredContent` dropped;
 * - `structured`: the JSON of `structuredContent` alone when the server sent one.
 */
export type StructuredContentMode = "auto" | "content" | "structured";

/**
 * The tool message `content` of a successful `tools/call` result. Only what models read
 * and nothing is repeated ({@link StructuredContentMode}):
 *
 * - one `text` block, and no `structuredContent` (or one that repeats the text) → the text;
 * - no content blocks and no `structuredContent` → `""`;
 * - anything else (several blocks, images, audio, embedded resources, resource links, or
 *   structured content the text does not repeat) → the JSON of
 *   `{ "content": [...blocks as the server sent them], "structuredContent"?: {...} }`.
 *
 * The result's `_meta` is dropped; binary data stays base64 as the server sent it.
 */
export function resultContent(
  result: CallToolResult,
  mode: StructuredContentMode = "auto",
): string {
  const blocks = result.content ?? [];
  const structured = mode === "content" ? undefined : result.structuredContent;
  if (mode === "structured" && structured !== undefined) return JSON.stringify(structured);
  const only = blocks.length === 1 ? blocks[0] : undefined;
  if (only?.type === "text") {
    if (structured === undefined || repeats(only.text, structured)) return only.text;
  }
  if (blocks.length === 0 && structured === undefined) return "";
  return JSON.stringify(
    structured === undefined
      ? { content: blocks }
      : { content: blocks, structuredContent: structured },
  );
}

/** The structured content says nothing the text does not: the same JSON, or just the text. */
function repeats(text: string, structured: unknown): boolean {
  if (typeof structured === "object" && structured !== null && !Array.isArray(structured)) {
    const values = Object.values(structured);
    if (values.length === 1 && values[0] === text) return true;
  }
  return sameJson(text, structured);
}

function sameJson(text: string, value: unknown): boolean {
  try {
    return isDeepStrictEqual(JSON.parse(text), value);
  } catch {
    return false;
  }
}

/**
 * The error for a result with `isError: true`: a terminal `tool_error` (the server ran the
 * tool and it failed; it said nothing about trying again), its content in `details`.
 */
export function resultError(result: CallToolResult, server: string, tool: string): ToolmeshError {
  const blocks = result.content ?? [];
  const text = blocks
    .flatMap((b) => (b.type === "text" ? [b.text] : []))
    .join("\n")
    .trim();
  const message =
    text === ""
      ? `MCP tool "${tool}" of server "${server}" reported an error`
      : truncate(text, MAX_MESSAGE_CHARS);
  return new ToolmeshError(ErrorCode.ToolError, message, {
    retryable: false,
    details: {
      server,
      tool,
      content: blocks,
      ...(result.structuredContent === undefined
        ? {}
        : { structuredContent: result.structuredContent }),
    },
  });
}

/** How a failed request should be handled by the connection. */
export type FailureKind =
  /** The server answered with an error; the connection is fine. */
  | "answered"
  /** The connection is gone or unusable: open a new one. */
  | "connection"
  /**
   * An HTTP session the server no longer knows (404, or a 400 that says the session is not
   * valid, as servers built on the SDK's examples answer after a restart): initialise again
   * and resend.
   */
  | "session_expired";

/** Classifies an error thrown by a request to an MCP server. */
export function failureKind(err: unknown): FailureKind {
  if (err instanceof SdkHttpError) {
    const status = err.status;
    if (status === 404) return "session_expired";
    if (status === 400 && /\bsession\b/i.test(httpReason(err))) return "session_expired";
    return status < 0 || status >= 500 ? "connection" : "answered";
  }
  // A JSON-RPC error answer, or the server's result failing the SDK's validation.
  if (err instanceof ProtocolError) return "answered";
  if (err instanceof SdkError && err.code === SdkErrorCode.InvalidResult) return "answered";
  if (err instanceof UnauthorizedError) return "answered";
  // The connection closed, a request timed out or could not be sent, a broken SSE stream,
  // fetch() failures (refused, reset, DNS), EPIPE on a dead stdio process.
  return "connection";
}

/**
 * What the server said in an HTTP error answer: the `error.message` of a JSON-RPC body, else
 * the body text, else the status text.
 */
export function httpReason(err: SdkHttpError): string {
  const text = typeof err.data.text === "string" ? err.data.text : undefined;
  const body = text ?? err.message.replace(/^Error POSTing to endpoint: /, "");
  try {
    const parsed = JSON.parse(body) as { error?: { message?: unknown } | string };
    const message = typeof parsed.error === "string" ? parsed.error : parsed.error?.message;
    if (typeof message === "string" && message !== "") return truncate(message, MAX_MESSAGE_CHARS);
  } catch {
    // not JSON: the text as it is
  }
  return truncate(body.trim(), MAX_MESSAGE_CHARS);
}

/** What the bridge does with a JSON-RPC internal error (-32603): the server option `internal_error`. */
export type InternalErrorPolicy = "fail" | "retry";

/**
 * A failed `tools/call` as a typed toolmesh error. JSON-RPC errors: method or tool not found
 * → `unknown_tool`; invalid params (-32602) → `invalid_parameters`; internal error (-32603)
 * → `tool_error`, retryable only under the `retry` policy; the request's time out →
 * `timeout`; an invalid result → terminal `tool_error`; the connection closed or the server
 * down → retryable `unavailable`; HTTP 401/403 → `permission_denied`; other HTTP 4xx →
 * terminal `tool_error` with the server's reason. Messages never carry request headers.
 */
export function callError(
  err: unknown,
  server: string,
  tool: string,
  internalError: InternalErrorPolicy = "fail",
): ToolmeshError {
  if (err instanceof ToolmeshError) return err;
  const where = { server, tool };
  if (err instanceof ProtocolError) {
    const details = {
      ...where,
      jsonrpc_code: err.code,
      ...(err.data === undefined ? {} : { data: err.data }),
    };
    // Servers on the SDK v1 prefix "MCP error <code>: "; the code is in details already.
    const message = err.message.replace(/^(MCP error -?\d+: )+/, "");
    switch (err.code as ProtocolErrorCode) {
      case ProtocolErrorCode.MethodNotFound:
        return new ToolmeshError(ErrorCode.UnknownTool, message, { retryable: false, details });
      case ProtocolErrorCode.InvalidParams:
        // The spec answers an unknown tool with -32602 too.
        return /\bunknown tool\b|\btool\b.*\bnot found\b/i.test(message)
          ? new ToolmeshError(ErrorCode.UnknownTool, message, { retryable: false, details })
          : new ToolmeshError(ErrorCode.InvalidParameters, message, {
              retryable: false,
              details,
            });
      case ProtocolErrorCode.InternalError:
        return new ToolmeshError(ErrorCode.ToolError, message, {
          retryable: internalError === "retry",
          details,
        });
      default:
        return new ToolmeshError(ErrorCode.ToolError, message, { retryable: false, details });
    }
  }
  if (err instanceof SdkError && !(err instanceof SdkHttpError)) {
    const sdkError = sdkFailure(err, server, where);
    if (sdkError !== undefined) return sdkError;
  }
  if (err instanceof UnauthorizedError) {
    return new ToolmeshError(
      ErrorCode.PermissionDenied,
      `MCP server "${server}" refused the bridge's credentials`,
      { retryable: false, details: where },
    );
  }
  if (err instanceof SdkHttpError) {
    // Forgotten again right after initialising: the server cannot keep a session just now.
    if (failureKind(err) === "session_expired") return unavailable(server, err, where);
    const status = err.status;
    const reason = httpReason(err);
    const said = reason === "" ? "" : `: ${reason}`;
    if (status === 401 || status === 403) {
      return new ToolmeshError(
        ErrorCode.PermissionDenied,
        `MCP server "${server}" answered HTTP ${status}${said}`,
        { retryable: false, details: { ...where, http_status: status, reason } },
      );
    }
    if (status >= 400 && status < 500) {
      return new ToolmeshError(
        ErrorCode.ToolError,
        `MCP server "${server}" answered HTTP ${status}${said}`,
        { retryable: false, details: { ...where, http_status: status, reason } },
      );
    }
  }
  return unavailable(server, err, where);
}

/**
 * The SDK's own failures of a request that have a type of their own: the connection closed
 * (retryable `unavailable`), the request's time ran out (`timeout`), the server's result is
 * not a valid result (terminal `tool_error`). Others (not connected, a send that failed) are
 * left to the caller: an unreachable server.
 */
function sdkFailure(
  err: SdkError,
  server: string,
  where: Record<string, unknown>,
): ToolmeshError | undefined {
  const details = { ...where, sdk_code: err.code };
  switch (err.code) {
    case SdkErrorCode.ConnectionClosed:
      return new ToolmeshError(
        ErrorCode.Unavailable,
        `MCP server "${server}" closed the connection`,
        { retryable: true, details },
      );
    case SdkErrorCode.RequestTimeout:
      return new ToolmeshError(ErrorCode.Timeout, err.message, { details });
    case SdkErrorCode.InvalidResult:
      return new ToolmeshError(
        ErrorCode.ToolError,
        `MCP server "${server}" sent an invalid result: ${truncate(err.message.replace(/\s+/g, " "), MAX_MESSAGE_CHARS)}`,
        { retryable: false, details },
      );
    default:
      return undefined;
  }
}

/** A retryable `unavailable` error for a server that cannot be reached right now. */
export function unavailable(
  server: string,
  err: unknown,
  details: Record<string, unknown> = { server },
): ToolmeshError {
  return new ToolmeshError(
    ErrorCode.Unavailable,
    `MCP server "${server}" is unavailable: ${describeError(err)}`,
    { retryable: true, details, cause: err },
  );
}

/** One line about an error, with the cause of fetch() failures ("fetch failed: ECONNREFUSED"). */
export function describeError(err: unknown): string {
  if (!(err instanceof Error)) return String(err);
  const spawnFailure = err as NodeJS.ErrnoException;
  if (spawnFailure.syscall?.startsWith("spawn") === true) {
    const what = spawnFailure.code === "ENOENT" ? "command not found" : "cannot run command";
    return `${what}: ${spawnFailure.path ?? "?"} (${err.message})`;
  }
  if (err instanceof SdkHttpError && err.status > 0) {
    return truncate(`${err.message} (HTTP ${err.status})`, MAX_MESSAGE_CHARS);
  }
  if (err instanceof SseError && (err.code ?? 0) > 0) {
    return truncate(`${err.message} (HTTP ${err.code})`, MAX_MESSAGE_CHARS);
  }
  const refused = privateAddressCause(err);
  if (refused !== undefined)
    return truncate(`${err.message}: ${refused.message}`, MAX_MESSAGE_CHARS);
  const cause = err.cause;
  const code =
    typeof cause === "object" && cause !== null && "code" in cause ? String(cause.code) : undefined;
  return truncate(code === undefined ? err.message : `${err.message}: ${code}`, MAX_MESSAGE_CHARS);
}

function truncate(text: string, max: number): string {
  return text.length <= max ? text : `${text.slice(0, max - 1)}…`;
}
