import { basename } from "node:path";
import { parseArgs } from "node:util";

/**
 * `parseArgs(config)` for a benchmark script; a flag it does not know, or one missing its value,
 * ends the run with one line (exit 2) that points at the script's header comment, which lists
 * its flags.
 */
export function benchFlags(config) {
  try {
    return parseArgs(config);
  } catch (err) {
    const script = `bench/${basename(process.argv[1] ?? "")}`;
    process.stderr.write(`${script}: ${err.message}; its first comment lists the flags it takes\n`);
    process.exit(2);
  }
}
