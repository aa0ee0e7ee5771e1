/**
 * Helpers of the Docker tests: the engine check, `docker` and Compose commands, and waits that
 * poll real state (container health, log lines) instead of sleeping.
 */
import { execFile } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { setTimeout as delay } from "node:timers/promises";
import { promisify } from "node:util";

const run = promisify(execFile);

/** The repository root: build context and Compose project directory. */
export const repoRoot = join(dirname(fileURLToPath(import.meta.url)), "..", "..");

/** Outcome of one command; `code` is its exit code. */
export interface CommandResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs a command from the repository root; never rejects on a non-zero exit. */
export async function command(
  file: string,
  args: string[],
  options: { env?: Record<string, string>; timeoutMs?: number; input?: string } = {},
): Promise<CommandResult> {
  try {
    const child = run(file, args, {
      cwd: repoRoot,
      env: { ...process.env, ...options.env },
      timeout: options.timeoutMs ?? 120_000,
      maxBuffer: 64 * 1024 * 1024,
    });
    if (options.input !== undefined) child.child.stdin?.end(options.input);
    const { stdout, stderr } = await child;
    return { code: 0, stdout, stderr };
  } catch (err) {
    const e = err as { code?: number | string; stdout?: string; stderr?: string; message?: string };
    return {
      code: typeof e.code === "number" ? e.code : -1,
      stdout: e.stdout ?? "",
      stderr: e.stderr || (e.message ?? ""),
    };
  }
}

/** Like {@link command}, but throws with the output when the exit code is not 0. */
export async function mustRun(
  file: string,
  args: string[],
  options: { env?: Record<string, string>; timeoutMs?: number; input?: string } = {},
): Promise<string> {
  const result = await command(file, args, options);
  if (result.code !== 0) {
    throw new Error(
      `${file} ${args.join(" ")} exited ${result.code}\n${result.stdout}\n${result.stderr}`,
    );
  }
  return result.stdout;
}

/**
 * Builds the project's image (`TOOLMESH_TEST_IMAGE`, default `toolmesh:test`) and its build
 * stage with test/docker/build-image.sh, which CI also runs ahead of the tests.
 */
export async function buildProjectImage(): Promise<void> {
  await mustRun("bash", ["test/docker/build-image.sh"], { timeoutMs: 20 * 60_000 });
}

/** Whether a Docker engine answers, and if not, why. */
export async function dockerEngine(): Promise<
  { ok: true; version: string } | { ok: false; why: string }
> {
  const result = await command("docker", ["info", "--format", "{{.ServerVersion}}"], {
    timeoutMs: 20_000,
  });
  if (result.code === 0 && result.stdout.trim() !== "") {
    return { ok: true, version: result.stdout.trim() };
  }
  return { ok: false, why: (result.stderr || result.stdout).trim().split("\n")[0] ?? "no answer" };
}

/** `docker compose` (v2) when the plugin exists, else `docker-compose` (1.29). */
export async function composeCommand(): Promise<[string, ...string[]]> {
  const v2 = await command("docker", ["compose", "version"], { timeoutMs: 20_000 });
  return v2.code === 0 ? ["docker", "compose"] : ["docker-compose"];
}

/** Polls `check` every 250 ms until it returns a value, or throws `describe()` after `timeoutMs`. */
export async function waitUntil<T>(
  check: () => Promise<T | undefined>,
  timeoutMs: number,
  describe: () => Promise<string> | string,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(await describe());
    await delay(250);
  }
}
