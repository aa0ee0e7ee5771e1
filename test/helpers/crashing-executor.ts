import { spawn } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { once } from "node:events";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..", "..");

/**
 * An executor process that may die at any time (the poison tool kills it), so unlike
 * `startService` its start does not require the "executor started" line.
 */
export interface ExecutorProcess {
  readonly child: ChildProcess;
  /** Resolves with the exit code or signal when the process ends. */
  readonly exited: Promise<string>;
  /** Resolves on the "executor started" log line; rejects if the process ends first. */
  readonly ready: Promise<void>;
  readonly stderr: () => string;
}

const executors = new Set<ExecutorProcess>();

/** Starts `services/executor/dist/main.js` with only PATH and `env`. */
export function spawnExecutor(env: Record<string, string>): ExecutorProcess {
  const child = spawn(process.execPath, [join(ROOT, "services", "executor", "dist", "main.js")], {
    cwd: ROOT,
    env: { PATH: process.env.PATH ?? "", TOOLMESH_LOG_LEVEL: "info", ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stderr = "";
  child.stderr.setEncoding("utf8");
  child.stderr.on("data", (chunk: string) => {
    stderr += chunk;
  });
  const exited = (once(child, "exit") as Promise<[number | null, NodeJS.Signals | null]>).then(
    ([code, signal]) => signal ?? String(code),
  );
  const ready = new Promise<void>((resolve, reject) => {
    let partial = "";
    child.stdout.setEncoding("utf8");
    child.stdout.on("data", (chunk: string) => {
      const parts = (partial + chunk).split("\n");
      partial = parts.pop() ?? "";
      if (parts.some((line) => line.includes('"msg":"executor started"'))) resolve();
    });
    void exited.then((how) => reject(new Error(`executor ended (${how}) before it started`)));
  });
  ready.catch(() => undefined); // a crashing executor may never be ready; callers decide
  const handle: ExecutorProcess = { child, exited, ready, stderr: () => stderr };
  executors.add(handle);
  void exited.then(() => executors.delete(handle));
  return handle;
}

/**
 * Restarts the executor each time it dies (waiting on its exit, never on a timer) until
 * `ended` settles. Returns how many processes died and the one left running.
 */
export async function superviseUntil(
  ended: Promise<unknown>,
  first: ExecutorProcess,
  env: Record<string, string>,
): Promise<{ deaths: number; survivor: ExecutorProcess }> {
  let current = first;
  let deaths = 0;
  for (;;) {
    const outcome = await Promise.race([
      ended.then(() => "ended" as const),
      current.exited.then(() => "died" as const),
    ]);
    if (outcome === "ended") return { deaths, survivor: current };
    deaths++;
    if (deaths > 10) throw new Error(`the executor died ${deaths} times:\n${current.stderr()}`);
    current = spawnExecutor(env);
  }
}

/** Kills every executor {@link spawnExecutor} started that still runs. */
export async function killExecutors(): Promise<void> {
  await Promise.all(
    [...executors].map(async (e) => {
      e.child.kill("SIGKILL");
      await e.exited;
    }),
  );
}
