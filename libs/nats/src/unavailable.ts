import { PermissionViolationError, RequestError, TimeoutError } from "@nats-io/nats-core";
import { JetStreamApiError } from "@nats-io/jetstream";
import { Defaults } from "@toolmesh/protocol";
import { JsApiCode } from "./api-codes.js";

/**
 * How a JetStream request failed in a way that heals by itself: a leader being elected (the
 * request times out, or the server answers "temporarily unavailable" or no one answers, 503),
 * or a consumer just created and not yet known where it was asked for.
 */
export type UnavailableKind = "timeout" | "no responders" | "unavailable" | "consumer not found";

/**
 * The kind of passing trouble `err` (or an error in its `cause` chain) is; undefined when
 * waiting cannot heal it (permission denied, a missing stream, a refused request). nats.js's own
 * `consume()` goes on through the same conditions: it pulls again after 503s and missed
 * heartbeats and keeps asking for a consumer it cannot find.
 */
export function unavailableKind(err: unknown): UnavailableKind | undefined {
  for (let e: unknown = err, depth = 0; e instanceof Error && depth < 5; depth++) {
    if (e instanceof PermissionViolationError || e instanceof StillUnavailableError)
      return undefined;
    if (e instanceof TimeoutError) return "timeout";
    // nats.js's JetStream API wraps a 503 in "jetstream is not enabled", the 503 its cause.
    if (e instanceof RequestError && e.isNoResponders()) return "no responders";
    if (e instanceof JetStreamApiError) {
      if (e.code === JsApiCode.ClusterNotAvailable) return "unavailable";
      if (e.code === JsApiCode.ConsumerNotFound) return "consumer not found";
      return undefined;
    }
    e = e.cause;
  }
  return undefined;
}

/**
 * What {@link retryWhileUnavailable} throws once its budget is spent: the trouble did not pass
 * in time. Not passing trouble itself, so a retry around the one that gave up throws it as it
 * is, rather than waiting a budget more and naming the operation twice.
 */
export class StillUnavailableError extends Error {
  override name = "StillUnavailableError";
}

/** Options of {@link retryWhileUnavailable}. Durations in ms. */
export interface RetryWhileUnavailableOptions {
  /** What is being done, for the final error: `read consumer TOOLMESH_WORK/x`. */
  what: string;
  /** How long to keep trying, in ms. Default `Defaults.startupTimeoutMs` (2 min). */
  budgetMs?: number;
  /** Told once per kind of trouble, the first time it is met (one log line, not one per try). */
  onRetry?(kind: UnavailableKind, err: unknown): void;
  /** Stops the waiting (the operation's last error is thrown). */
  signal?: AbortSignal;
}

/**
 * Runs `operation` until it succeeds, trying again with backoff (250 ms doubling to 5 s) while
 * it fails in a way that heals by itself ({@link unavailableKind}), for at most `budgetMs`.
 * Another failure, or the last one once the budget is spent, is thrown.
 */
export async function retryWhileUnavailable<T>(
  operation: () => Promise<T>,
  options: RetryWhileUnavailableOptions,
): Promise<T> {
  const budgetMs = options.budgetMs ?? Defaults.startupTimeoutMs;
  const deadline = Date.now() + budgetMs;
  const told = new Set<UnavailableKind>();
  for (let delayMs = 250; ; delayMs = Math.min(delayMs * 2, 5_000)) {
    try {
      return await operation();
    } catch (err) {
      const kind = unavailableKind(err);
      if (kind === undefined) throw err;
      if (Date.now() + delayMs > deadline || options.signal?.aborted === true) {
        throw new StillUnavailableError(
          `cannot ${options.what} within ${String(budgetMs)} ms (${kind}: ${err instanceof Error ? err.message : String(err)})`,
          { cause: err },
        );
      }
      if (!told.has(kind)) {
        told.add(kind);
        options.onRetry?.(kind, err);
      }
      await new Promise((resolve) => setTimeout(resolve, delayMs));
    }
  }
}

/**
 * An `onRetry` / `onConsumerUnavailable` that says once per kind of trouble, as a warning on
 * `log`, that the consumer or bucket `name` cannot be read yet.
 */
export function warnUnavailable(
  log: { warn(fields: Record<string, unknown>, message: string): void },
  name: string,
  what: "consumer" | "bucket" = "consumer",
): (kind: UnavailableKind, err: unknown) => void {
  return (kind, err) => {
    log.warn(
      { [what]: name, kind, reason: err instanceof Error ? err.message : String(err) },
      `${what} cannot be read yet (${kind}); trying again`,
    );
  };
}
