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
