const DURATION = /^(\d+)(ms|s|m|h|d)$/;
const UNIT_MS: Record<string, number> = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000 };

/**
 * A duration written as a whole number and a unit (`250ms`, `90s`, `30m`, `2h`, `90d`), in ms;
 * `undefined` when `value` is not one.
 */
export function parseDurationMs(value: string): number | undefined {
  const match = DURATION.exec(value.trim());
  if (match === null) return undefined;
  return Number(match[1]) * (UNIT_MS[match[2] ?? "ms"] ?? 1);
}

/**
 * Waits for `promise` at most `ms`: true when it fulfilled in time, false when the bound came
 * first; rejects when `promise` rejected in time. The bound's timer is cleared with the wait (one
 * left per call would outlive it), and plainly: aborting a timer promise instead makes an
 * `AbortError` (a `DOMException` with its stack) every time.
 */
export async function settledWithin(promise: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const bound = new Promise<false>((resolve) => {
    timer = setTimeout(() => resolve(false), ms);
  });
  try {
    return await Promise.race([promise.then(() => true as const), bound]);
  } finally {
    clearTimeout(timer);
  }
}
