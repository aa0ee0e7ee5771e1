import { InvalidArgumentError } from "commander";

/** Parses an option value that must be a positive integer (`--limit`, `--max-connections`, …). */
export function positiveInt(value: string): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n <= 0) throw new InvalidArgumentError("must be a positive integer");
  return n;
}
