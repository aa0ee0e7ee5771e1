import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";

/** What a load test's ledger tool wrote, by call id. */
export interface Ledgers {
  /** Side effects: one file per idempotency key (base64url), counted by the key's call id. */
  effects: Map<string, number>;
  /** Handler invocations: one `{call id}\t…` line per run, in one file per executor. */
  invocations: Map<string, number>;
}

/**
 * Reads the ledgers of the fault-tolerance tools (`test/fixtures/tools-fault`): side effects
 * keyed by idempotency key in `ledgerDir`, handler invocations in `execDir`.
 */
export function readLedgers(ledgerDir: string, execDir: string): Ledgers {
  const effects = new Map<string, number>();
  for (const name of readdirSync(ledgerDir)) {
    const key = Buffer.from(name, "base64url").toString("utf8");
    const id = key.slice(key.lastIndexOf("/") + 1);
    effects.set(id, (effects.get(id) ?? 0) + 1);
  }
  const invocations = new Map<string, number>();
  for (const name of readdirSync(execDir)) {
    for (const line of readFileSync(join(execDir, name), "utf8").split("\n")) {
      if (line === "") continue;
      const id = line.split("\t")[0] as string;
      invocations.set(id, (invocations.get(id) ?? 0) + 1);
    }
  }
  return { effects, invocations };
}
