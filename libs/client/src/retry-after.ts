import type { ToolMessage, WireError } from "@toolmesh/protocol";

/**
 * How long to wait before submitting a refused call again, in ms: `details.retry_after_ms` of a
 * retryable error (`rate_limited`, `quota_exceeded` for a concurrency limit, `overloaded`).
 * Undefined when the message succeeded, is not retryable or names no delay.
 */
export function retryAfterMs(
  message: Pick<ToolMessage, "error"> | { error?: WireError },
): number | undefined {
  const error = message.error;
  if (error === undefined || !error.retryable) return undefined;
  const after = error.details?.retry_after_ms;
  return typeof after === "number" && Number.isFinite(after) && after >= 0 ? after : undefined;
}
