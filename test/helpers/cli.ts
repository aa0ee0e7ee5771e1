import { execFile } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const run = promisify(execFile);
/** The CLI's entry point. */
export const BIN = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "bin", "toolmesh.js");

/** What a CLI run printed and how it ended. */
export interface CliOutcome {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs `toolmesh <args>` as its own process with only PATH and `env`; never rejects. */
export async function runCli(args: string[], env: Record<string, string>): Promise<CliOutcome> {
  try {
    const { stdout, stderr } = await run(process.execPath, [BIN, ...args], {
      env: { PATH: process.env.PATH ?? "", ...env },
      timeout: 60_000,
    });
    return { code: 0, stdout, stderr };
  } catch (err) {
    const e = err as { code?: number; stdout?: string; stderr?: string };
    return {
      code: typeof e.code === "number" ? e.code : -1,
      stdout: e.stdout ?? "",
      stderr: e.stderr ?? "",
    };
  }
}

/** Runs `toolmesh <args>` with `input` on its stdin; never rejects. */
export function runCliWithInput(
  args: string[],
  env: Record<string, string>,
  input: string,
): Promise<CliOutcome> {
  return new Promise((resolve) => {
    const child = execFile(
      process.execPath,
      [BIN, ...args],
      { env: { PATH: process.env.PATH ?? "", ...env }, timeout: 60_000 },
      (err, stdout, stderr) => {
        const code = (err as { code?: unknown } | null)?.code;
        resolve({ code: err === null ? 0 : typeof code === "number" ? code : -1, stdout, stderr });
      },
    );
    child.stdin?.end(input);
  });
}
