import type { Msg, NatsConnection, Subscription } from "@nats-io/nats-core";
import type { Subjects, WireError } from "@toolmesh/protocol";
import {
  Defaults,
  ErrorCode,
  ToolmeshError,
  decodeJson,
  encodeJson,
  payloadTooLarge,
  requestError,
} from "@toolmesh/protocol";
import type { Logger } from "@toolmesh/telemetry";
import { isNatsError } from "./nats-errors.js";

/** The one failure envelope of request-reply: `{ ok: false, error }`. */
export interface RequestFailure {
  ok: false;
  error: WireError;
}

/** The reply to a request that failed, in the one failure envelope. */
export function requestFailure(error: WireError): RequestFailure {
  return { ok: false, error };
}

/**
 * How one kind of request is answered, with what it needs to be answered without a connection
 * (tests hand {@link answerRequest} a message). `S` is what {@link RequestKind.scope} takes from
 * the subject (the tenant of `{p}.v1.rpc.{tenant}.*`).
 */
export interface RequestKind<S = undefined> {
  log: Logger;
  /**
   * Reads the request's scope from its subject before its body is read; throws a
   * {@link ToolmeshError} to refuse a subject that names none ({@link rpcTenantScope}).
   */
  scope?: (msg: Msg) => S;
  /**
   * Answers one request: `body` is the request's JSON, already decoded; `msg` gives its
   * subject; `scope` is what {@link RequestKind.scope} read. It may return a promise. Throw a
   * {@link ToolmeshError} to refuse it; a `ZodError` thrown by `.parse()` becomes
   * `invalid_request` with `details.issues`; a NATS failure becomes `unavailable`; anything
   * else (a bug) is logged and becomes `internal`.
   */
  handle: (body: unknown, msg: Msg, scope: S) => unknown;
  /**
   * The subject prefixes a reply may go to (each ending in `.`). A request whose reply subject
   * is under none of them is neither handled nor answered, only logged: the answer would go out
   * with this service's rights wherever the requester named (a KV key, a stream's subject).
   * Default: any reply subject.
   */
  replyPrefixes?: readonly string[];
  /** The reply for a request that failed. Default {@link requestFailure}, `{ ok: false, error }`. */
  refusal?: (error: WireError) => unknown;
  /** Name of the requests in errors and logs (`"cancel request"`). Default `"request"`. */
  what?: string;
  /**
   * Largest request body answered, in bytes, for every request or by its scope; a larger one
   * is refused with `payload_too_large` (`details.field: "request"`) before it is read.
   * Default: no limit of its own (the connection's `max_payload` still bounds it).
   */
  maxRequestBytes?: number | ((scope: S) => number | undefined) | undefined;
  /**
   * Largest reply sent, in bytes; a larger one is replaced by the `payload_too_large` refusal
   * (`details.field: "reply"`). Default: the server's `max_payload` when the connection knows
   * it, else what `msg.respond` accepts.
   */
  maxReplyBytes?: number;
}

/** Options of {@link serveRequests}. */
export interface ServeRequestsOptions<S = undefined> extends RequestKind<S> {
  nc: NatsConnection;
  /** The subject served; may hold wildcards (`toolmesh.v1.cancel.*.*`). */
  subject: string;
  /** Queue group shared by the replicas of the service. */
  queue: string;
}

/** A running request server. */
export interface RequestServer {
  /** Requests being answered now. */
  readonly inFlight: number;
  /**
   * Stops taking requests and waits for those in hand, at most `graceMs` (default
   * `Defaults.shutdownGraceMs`); resolves early when they are done.
   */
  stop(graceMs?: number): Promise<void>;
}

/**
 * Serves core NATS request-reply on `subject` in a queue group, with one error mapping for
 * every service: a body over the kind's limit is `payload_too_large`, a body that is not JSON
 * is `invalid_request` ("… is not JSON"), a body of the wrong shape `invalid_request` with
 * `details.issues`, a typed error passes as it is, a NATS failure is `unavailable`, anything
 * else is `internal`; the last two are logged. A reply larger than the server's `max_payload`
 * is replaced by `payload_too_large`, and nothing a handler does ends the process. `stop` waits
 * for requests in flight, so a draining process answers what it took.
 */
export function serveRequests<S = undefined>(options: ServeRequestsOptions<S>): RequestServer {
  const { nc, subject, queue, log } = options;
  const running = new Set<Promise<void>>();
  const kind: RequestKind<S> = {
    ...options,
    // Read per answer: a reconnect may land on a server with another max_payload.
    get maxReplyBytes() {
      return options.maxReplyBytes ?? nc.info?.max_payload;
    },
  };

  const sub: Subscription = nc.subscribe(subject, {
    queue,
    callback: (err, msg) => {
      if (err !== null) {
        log.error({ err, subject }, "request subscription failed");
        return;
      }
      const task = answerRequest(msg, kind).finally(() => running.delete(task));
      running.add(task);
    },
  });

  return {
    get inFlight() {
      return running.size;
    },
    async stop(graceMs = Defaults.shutdownGraceMs) {
      sub.unsubscribe();
      if (running.size === 0) return;
      let timer: NodeJS.Timeout | undefined;
      const grace = new Promise<void>((resolve) => {
        timer = setTimeout(resolve, graceMs);
        timer.unref();
      });
      await Promise.race([Promise.allSettled([...running]), grace]);
      clearTimeout(timer);
    },
  };
}

/**
 * Answers one request as {@link serveRequests} does: the handler's reply, or the refusal of
 * the typed error it failed with. Never rejects. Needs no connection: tests hand it a message.
 */
export async function answerRequest<S = undefined>(msg: Msg, kind: RequestKind<S>): Promise<void> {
  const what = kind.what ?? "request";
  const refusal = kind.refusal ?? requestFailure;
  if (
    kind.replyPrefixes !== undefined &&
    !kind.replyPrefixes.some((p) => msg.reply?.startsWith(p))
  ) {
    kind.log.warn(
      { subject: msg.subject, reply: msg.reply },
      `${what} ignored: its reply subject is not allowed`,
    );
    return;
  }
  let reply: unknown;
  try {
    const scope = kind.scope === undefined ? (undefined as S) : kind.scope(msg);
    const limit =
      typeof kind.maxRequestBytes === "function"
        ? kind.maxRequestBytes(scope)
        : kind.maxRequestBytes;
    reply = await kind.handle(readBody(msg, limit, what), msg, scope);
  } catch (err) {
    reply = refusal(failureOf(err, msg, kind, what).toWire());
  }
  if (msg.reply === undefined || msg.reply === "") return;
  try {
    respond(msg, encodeJson(reply), kind, refusal, what);
  } catch (err) {
    // The connection closed, or the refusal itself cannot be sent: the requester times out.
    kind.log.error({ err, subject: msg.subject }, `cannot answer a ${what}`);
  }
}

function readBody(msg: Msg, limit: number | undefined, what: string): unknown {
  if (limit !== undefined && msg.data.length > limit) {
    throw payloadTooLarge(`the ${what} is ${msg.data.length} bytes; it may have at most ${limit}`, {
      field: "request",
      bytes: msg.data.length,
      limit,
    });
  }
  try {
    return decodeJson(msg.data);
  } catch (err) {
    throw new ToolmeshError(ErrorCode.InvalidRequest, `${what} is not JSON`, { cause: err });
  }
}

/**
 * The typed error of a failed request: a typed, zod or NATS error as {@link requestError} maps
 * it, anything else (a bug) `internal`. What is not the requester's fault is logged.
 */
function failureOf(
  err: unknown,
  msg: Msg,
  kind: Pick<RequestKind<unknown>, "log">,
  what: string,
): ToolmeshError {
  // A NATS or KV failure may pass; anything else thrown is a bug of the handler.
  const error = requestError(
    err,
    what,
    isNatsError(err) ? ErrorCode.Unavailable : ErrorCode.Internal,
  );
  if (error.code === ErrorCode.Internal || error.code === ErrorCode.Unavailable)
    kind.log.error({ err: error, subject: msg.subject }, `${what} failed`);
  return error;
}

/** Sends `data`, or the `payload_too_large` refusal when it is over the reply limit. */
function respond(
  msg: Msg,
  data: Uint8Array,
  kind: Pick<RequestKind<unknown>, "maxReplyBytes" | "log">,
  refusal: (error: WireError) => unknown,
  what: string,
): void {
  const limit = kind.maxReplyBytes;
  if (limit === undefined || data.length <= limit) {
    try {
      msg.respond(data);
      return;
    } catch (err) {
      // Without a known limit, the client's own max_payload check is the one that speaks.
      if (limit !== undefined || !isNatsError(err)) throw err;
      return respondTooLarge(msg, data.length, undefined, kind, refusal, what);
    }
  }
  respondTooLarge(msg, data.length, limit, kind, refusal, what);
}

function respondTooLarge(
  msg: Msg,
  bytes: number,
  limit: number | undefined,
  kind: Pick<RequestKind<unknown>, "log">,
  refusal: (error: WireError) => unknown,
  what: string,
): void {
  const most = limit ?? bytes - 1;
  const error = payloadTooLarge(
    `the answer to this ${what} would be ${bytes} bytes; the server carries at most ${most}`,
    { field: "reply", bytes, limit: most },
  );
  kind.log.warn({ subject: msg.subject, bytes, limit: most }, `${what} answer too large`);
  msg.respond(encodeJson(refusal(error.toWire())));
}

/**
 * The scope of `{p}.v1.rpc.{tenant}.*` requests: the tenant the subject names, or
 * `invalid_request` for a token no tenant id maps to.
 */
export function rpcTenantScope(subjects: Subjects): (msg: Msg) => string {
  return (msg) => {
    const tenant = subjects.parseRpcTenant(msg.subject);
    if (tenant === undefined) {
      throw new ToolmeshError(
        ErrorCode.InvalidRequest,
        `request subject "${msg.subject}" holds a tenant token no tenant id maps to`,
        { details: { subject: msg.subject } },
      );
    }
    return tenant;
  };
}
