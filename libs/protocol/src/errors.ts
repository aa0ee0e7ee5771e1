import { z } from "zod";

/**
 * Every error code that can cross the wire. A frontend switches on `code`; `message` is for
 * people and models; `details` is structured and documented per code in `docs/errors.md`.
 */
export const ErrorCode = {
  /** `function.arguments` is not JSON, or not a JSON object. */
  InvalidArguments: "invalid_arguments",
  /** The call envelope itself is malformed (missing id, bad session id, wrong types). */
  InvalidRequest: "invalid_request",
  /** No tool of that name is registered; `details.close_matches` lists near names. */
  UnknownTool: "unknown_tool",
  /** Arguments fail the tool's JSON Schema; `details.errors` holds JSON-pointer paths. */
  InvalidParameters: "invalid_parameters",
  /** Required arguments are missing; `details.missing_required` and the schema. */
  MissingArguments: "missing_arguments",
  /** Every group the tool belongs to is inactive for the session. */
  ToolDisabled: "tool_disabled",
  /** One attempt ran longer than the tool's per-attempt timeout. */
  Timeout: "timeout",
  /** The call as a whole ran out of time. */
  DeadlineExceeded: "deadline_exceeded",
  /** The tool itself failed; `retryable` says whether trying again may help. */
  ToolError: "tool_error",
  /** No worker is available for the tool, or its backing server is down. */
  Unavailable: "unavailable",
  /** The caller may not do this. */
  PermissionDenied: "permission_denied",
  /** The message is larger than the server or stream accepts. */
  PayloadTooLarge: "payload_too_large",
  /** The call was cancelled by its caller. */
  Cancelled: "cancelled",
  /** Too much work in flight for this session; retry after `details.retry_after_ms`. */
  Overloaded: "overloaded",
  /**
   * The caller's tenant (or agent, or tenant × tool) ran out of its call rate; retryable, try
   * again after `details.retry_after_ms`.
   */
  RateLimited: "rate_limited",
  /**
   * A quota of the caller refused the call: `details.quota` names it (`max_in_flight`,
   * `max_queued`, `daily`) with its `limit` and `scope`; retryable for concurrency limits.
   */
  QuotaExceeded: "quota_exceeded",
  /** The same idempotency key was used with different arguments. */
  IdempotencyConflict: "idempotency_conflict",
  /**
   * The idempotency key names a call still running under another call id; its final message
   * goes to that id (`details.call_id`). Submitted again once it ended, the stored final
   * message answers the new id.
   */
  IdempotencyInFlight: "idempotency_in_flight",
  /**
   * The tool acts as the caller and has no credential for them: the call names no user, or the
   * user registered no secret for the tool (`details.tool`, `details.type`). Authorize, then
   * submit again.
   */
  CredentialRequired: "credential_required",
  /**
   * A person refused a call that waited for approval (`details.decided_by`, `details.reason`);
   * the tool never ran.
   */
  ApprovalDenied: "approval_denied",
  /**
   * A call waited for approval past `details.expires_at` and nobody decided it; the tool never
   * ran. Submit it again under a new idempotency key to ask again.
   */
  ApprovalExpired: "approval_expired",
  /** A bug or an unexpected failure inside toolmesh. */
  Internal: "internal",
} as const;

/** Union of the wire error codes. */
export type ErrorCode = (typeof ErrorCode)[keyof typeof ErrorCode];

const ERROR_CODES = Object.values(ErrorCode) as [ErrorCode, ...ErrorCode[]];

/** Codes whose errors are worth retrying unless the thrower says otherwise. */
const RETRYABLE_BY_DEFAULT: ReadonlySet<ErrorCode> = new Set<ErrorCode>([
  ErrorCode.Timeout,
  ErrorCode.Unavailable,
  ErrorCode.Overloaded,
  ErrorCode.RateLimited,
  ErrorCode.IdempotencyInFlight,
  ErrorCode.Internal,
]);

/** Whether errors with this code are retryable when nobody said otherwise. */
export function isRetryableByDefault(code: ErrorCode): boolean {
  return RETRYABLE_BY_DEFAULT.has(code);
}

/** The error as it travels on the wire, inside a tool message. */
export const WireErrorSchema = z
  .object({
    code: z.enum(ERROR_CODES),
    message: z.string(),
    retryable: z.boolean(),
    details: z.record(z.string(), z.unknown()).optional(),
  })
  .meta({ id: "WireError", description: "A typed error carried by a tool message." });

/** The error as it travels on the wire. */
export type WireError = z.infer<typeof WireErrorSchema>;

/** Options for {@link ToolmeshError}. */
export interface ToolmeshErrorOptions {
  /** Structured details; documented per code. */
  details?: Record<string, unknown>;
  /** Overrides the code's default retry verdict. */
  retryable?: boolean;
  /** The underlying error, kept locally and never sent on the wire. */
  cause?: unknown;
}

/**
 * A typed toolmesh error. Local: it may carry a `cause` that never leaves the process;
 * {@link ToolmeshError.toWire} gives what crosses the wire.
 */
export class ToolmeshError extends Error {
  override readonly name = "ToolmeshError";
  readonly code: ErrorCode;
  readonly retryable: boolean;
  readonly details: Record<string, unknown> | undefined;

  constructor(code: ErrorCode, message: string, options: ToolmeshErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.code = code;
    this.retryable = options.retryable ?? isRetryableByDefault(code);
    this.details = options.details;
  }

  /** The wire form: code, message, retry verdict and details; never the cause or stack. */
  toWire(): WireError {
    const wire: WireError = { code: this.code, message: this.message, retryable: this.retryable };
    if (this.details !== undefined) wire.details = this.details;
    return wire;
  }

  /** Rebuilds a local error from its wire form. */
  static fromWire(wire: WireError): ToolmeshError {
    return new ToolmeshError(wire.code, wire.message, {
      retryable: wire.retryable,
      ...(wire.details === undefined ? {} : { details: wire.details }),
    });
  }
}

/**
 * Thrown by a tool handler to say "trying again may help". `retryAfterMs` asks for a
 * minimum delay before the next attempt.
 */
export class RetryableError extends ToolmeshError {
  readonly retryAfterMs: number | undefined;

  constructor(
    message: string,
    options: { retryAfterMs?: number; details?: Record<string, unknown>; cause?: unknown } = {},
  ) {
    super(ErrorCode.ToolError, message, { ...options, retryable: true });
    this.retryAfterMs = options.retryAfterMs;
  }
}

/** Thrown by a tool handler to say "this will fail the same way every time". */
export class TerminalError extends ToolmeshError {
  constructor(
    message: string,
    options: { details?: Record<string, unknown>; cause?: unknown } = {},
  ) {
    super(ErrorCode.ToolError, message, { ...options, retryable: false });
  }
}

/**
 * Turns anything thrown into a {@link ToolmeshError}. Typed errors pass through; other
 * errors become `fallback` (default `internal`) with their message and the original as cause.
 */
export function ensureError(err: unknown, fallback: ErrorCode = ErrorCode.Internal): ToolmeshError {
  if (err instanceof ToolmeshError) return err;
  if (err instanceof Error)
    return new ToolmeshError(fallback, err.message || err.name, { cause: err });
  return new ToolmeshError(
    fallback,
    typeof err === "string" ? err : `non-error thrown: ${String(err)}`,
    {
      cause: err,
    },
  );
}

/** One problem zod found in a request: a JSON pointer and what was wrong there. */
export interface RequestIssue {
  path: string;
  message: string;
}

/** The issues of a failed zod parse as JSON pointers (`/tool_call/id`) and messages. */
export function requestIssues(error: z.ZodError): RequestIssue[] {
  return error.issues.map((i) => ({ path: `/${i.path.join("/")}`, message: i.message }));
}

/**
 * The issues of a failed zod parse on one line, for a message a person reads:
 * `description: Invalid input: expected string, received number; parameters: …` (a problem of
 * the whole value without a path).
 */
export function issuesLine(error: z.ZodError): string {
  return error.issues
    .map((i) => (i.path.length === 0 ? i.message : `${i.path.join(".")}: ${i.message}`))
    .join("; ");
}

/**
 * An `invalid_request` error for a request body of the wrong shape: the message names every
 * problem (`what` names the request, e.g. `"malformed cancel request"`), `details.issues`
 * lists them as {@link RequestIssue}s.
 */
export function malformedRequest(error: z.ZodError, what = "malformed request"): ToolmeshError {
  const issues = requestIssues(error);
  return new ToolmeshError(
    ErrorCode.InvalidRequest,
    `${what}: ${issues.map((i) => `${i.path} ${i.message}`).join("; ")}`,
    { details: { issues } },
  );
}

/** Parses a request body with `schema`, or throws {@link malformedRequest}. */
export function parseRequest<T>(
  schema: z.ZodType<T>,
  body: unknown,
  what = "malformed request",
): T {
  const parsed = schema.safeParse(body);
  if (parsed.success) return parsed.data;
  throw malformedRequest(parsed.error, what);
}

/**
 * The typed error a failed request is answered with: a `ZodError` (a `.parse()` of the body)
 * is {@link malformedRequest}, a typed error passes as it is, anything else is `fallback`
 * (default `unavailable`: NATS or KV trouble).
 */
export function requestError(
  err: unknown,
  what = "request",
  fallback: ErrorCode = ErrorCode.Unavailable,
): ToolmeshError {
  if (err instanceof z.ZodError) return malformedRequest(err, `malformed ${what}`);
  return ensureError(err, fallback);
}

/**
 * The `payload_too_large` error of something over its size limit: `details.bytes` is its size
 * and `details.limit` the most allowed, both in bytes, and `details.field` names what was
 * measured (`"request"`, `"reply"`, `"description"`, …). Not retryable: the same thing is as
 * large next time.
 */
export function payloadTooLarge(
  message: string,
  size: { bytes: number; limit: number; field: string; [key: string]: unknown },
): ToolmeshError {
  return new ToolmeshError(ErrorCode.PayloadTooLarge, message, {
    retryable: false,
    details: size,
  });
}
