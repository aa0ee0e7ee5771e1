import type { Msg, NatsConnection, Subscription } from "@nats-io/nats-core";
import type { WireError } from "@toolmesh/protocol";
import { ErrorCode, ToolmeshError, decodeJson, encodeJson, requestError } from "@toolmesh/protocol";
import type { Logger } from "@toolmesh/telemetry";

/** Options of {@link serveRequests}. */
export interface ServeRequestsOptions {
  nc: NatsConnection;
  /** The subject served; may hold wildcards (`toolmesh.v1.cancel.*.*`). */
  subject: string;
  /** Queue group shared by the replicas of the service. */
  queue: string;
  log: Logger;
  /**
   * Answers one request: `body` is the request's JSON, already decoded; `msg` gives its
   * subject; it may return a promise. Throw a {@link ToolmeshError} to refuse it; a `ZodError` thrown by `.parse()`
   * becomes `invalid_request` with `details.issues`; anything else becomes `unavailable`.
   */
  handle: (body: unknown, msg: Msg) => unknown;
  /** The reply for a request that failed: e.g. `{ ok: false, error }`. */
  refusal: (error: WireError) => unknown;
  /** Name of the requests in errors and logs (`"cancel request"`). Default `"request"`. */
  what?: string;
}

/** A running request server. */
export interface RequestServer {
  /** Requests being answered now. */
  readonly inFlight: number;
  /**
   * Stops taking requests and waits for those in hand, at most `graceMs`; resolves early when
   * they are done.
   */
  stop(graceMs: number): Promise<void>;
}

/**
 * Serves core NATS request-reply on `subject` in a queue group, with one error mapping for
 * every service: a body that is not JSON is `invalid_request` ("… is not JSON"), a body of the
 * wrong shape `invalid_request` with `details.issues`, a typed error passes as it is, and
 * anything else (NATS or KV trouble) is `unavailable` and logged. `stop` waits for requests in
 * flight, so a draining process answers what it took.
 */
export function serveRequests(options: ServeRequestsOptions): RequestServer {
  const { nc, subject, queue, log } = options;
  const running = new Set<Promise<void>>();

  const sub: Subscription = nc.subscribe(subject, {
    queue,
    callback: (err, msg) => {
      if (err !== null) {
        log.error({ err, subject }, "request subscription failed");
        return;
      }
      const task = answerRequest(msg, options).finally(() => running.delete(task));
      running.add(task);
    },
  });

  return {
    get inFlight() {
      return running.size;
    },
    async stop(graceMs) {
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
 * the typed error it failed with. Needs no connection: tests hand it a message.
 */
export async function answerRequest(
  msg: Msg,
  options: Pick<ServeRequestsOptions, "handle" | "refusal" | "log" | "what">,
): Promise<void> {
  const { handle, refusal, log } = options;
  const what = options.what ?? "request";
  let reply: unknown;
  try {
    let body: unknown;
    try {
      body = decodeJson(msg.data);
    } catch (err) {
      throw new ToolmeshError(ErrorCode.InvalidRequest, `${what} is not JSON`, { cause: err });
    }
    reply = await handle(body, msg);
  } catch (err) {
    const error = requestError(err, what);
    if (error.code === ErrorCode.Internal || error.code === ErrorCode.Unavailable)
      log.error({ err: error, subject: msg.subject }, `${what} failed`);
    reply = refusal(error.toWire());
  }
  if (msg.reply !== undefined && msg.reply !== "") msg.respond(encodeJson(reply));
}
