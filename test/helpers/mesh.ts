import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { appendFileSync, mkdirSync } from "node:fs";
import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { ToolmeshClient } from "@toolmesh/client";
import { connectNats } from "@toolmesh/nats";
import { ErrorCode } from "@toolmesh/protocol";
import { loadConfig } from "@toolmesh/runtime";
import { eventually } from "./eventually.js";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..", "..");

/** A toolmesh service running as its own process, started from the built `dist/`. */
export interface ServiceProcess {
  readonly pid: number;
  readonly child: ChildProcess;
  /** The environment it was started with (besides `PATH` and the log level). */
  readonly env: Readonly<Record<string, string>>;
  /** Parsed JSON log lines written so far. */
  readonly lines: Record<string, unknown>[];
  /** Resolves with the first log line matching `predicate` (already written or future). */
  waitForLog(
    predicate: (line: Record<string, unknown>) => boolean,
    timeoutMs?: number,
  ): Promise<Record<string, unknown>>;
  /** Everything written to stderr so far. */
  stderr(): string;
  /** SIGTERM and wait for exit; resolves with the exit code. */
  stop(): Promise<number | null>;
  /** SIGKILL and wait for exit. */
  kill(): Promise<void>;
}

const running = new Set<ServiceProcess>();

/** The services {@link startService} starts. */
export type ServiceName = "resolver" | "executor" | "schema-expander" | "mcp-bridge" | "gateway";

/**
 * Starts `services/<service>/dist/main.js` with the given environment and waits for its
 * "<service> started" log line (readiness, not a sleep).
 */
export async function startService(
  service: ServiceName,
  env: Record<string, string>,
  timeoutMs = 20_000,
): Promise<ServiceProcess> {
  const handle = spawnService(service, env);
  await handle.waitForLog((l) => l.msg === `${service} started`, timeoutMs);
  return handle;
}

/** Where every service's log lines are kept too, one file per process, when set (made if missing). */
const LOG_DIR = process.env.TOOLMESH_TEST_SERVICE_LOG_DIR || undefined;
if (LOG_DIR !== undefined) mkdirSync(LOG_DIR, { recursive: true });

/** Starts `services/<service>/dist/main.js` with the given environment; waits for nothing. */
export function spawnService(service: ServiceName, env: Record<string, string>): ServiceProcess {
  const child = spawn(process.execPath, [join(ROOT, "services", service, "dist", "main.js")], {
    cwd: ROOT,
    env: {
      PATH: process.env.PATH ?? "",
      TOOLMESH_LOG_LEVEL: process.env.TOOLMESH_TEST_LOG_LEVEL ?? "info",
      ...env,
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  const lines: Record<string, unknown>[] = [];
  const waiters = new Set<{
    predicate: (l: Record<string, unknown>) => boolean;
    resolve: (l: Record<string, unknown>) => void;
  }>();
  let stderr = "";
  let partial = "";
  child.stdout.setEncoding("utf8");
  child.stdout.on("data", (chunk: string) => {
    const parts = (partial + chunk).split("\n");
    partial = parts.pop() ?? "";
    for (const text of parts) {
      if (text.trim() === "") continue;
      let line: Record<string, unknown>;
      try {
        line = JSON.parse(text) as Record<string, unknown>;
      } catch {
        line = { msg: text };
      }
      lines.push(line);
      if (LOG_DIR !== undefined)
        appendFileSync(join(LOG_DIR, `${service}-${child.pid}.log`), `${text}\n`);
      for (const w of waiters) {
        if (w.predicate(line)) {
          waiters.delete(w);
          w.resolve(line);
        }
      }
    }
  });
  child.stderr.setEncoding("utf8");
  child.stderr.on("data", (chunk: string) => {
    stderr += chunk;
  });
  const exited = once(child, "exit") as Promise<[number | null, NodeJS.Signals | null]>;

  const handle: ServiceProcess = {
    pid: child.pid ?? -1,
    child,
    env,
    lines,
    stderr: () => stderr,
    waitForLog(predicate, waitMs = 20_000) {
      const found = lines.find(predicate);
      if (found !== undefined) return Promise.resolve(found);
      return new Promise((resolve, reject) => {
        const waiter = { predicate, resolve };
        waiters.add(waiter);
        const timer = setTimeout(() => {
          waiters.delete(waiter);
          reject(
            new Error(
              // Its last log lines say where it stands (what it waits for).
              `${service} ${child.pid}: no matching log line within ${waitMs} ms; its last: ${JSON.stringify(
                lines.slice(-5).map((l) => [l.time, l.msg]),
              )}\n${stderr}`,
            ),
          );
        }, waitMs);
        void exited.then(([code]) => {
          if (!waiters.has(waiter)) return;
          waiters.delete(waiter);
          clearTimeout(timer);
          reject(
            new Error(
              `${service} exited with ${String(code)} before the expected log line\n${stderr}`,
            ),
          );
        });
        const original = waiter.resolve;
        waiter.resolve = (l) => {
          clearTimeout(timer);
          original(l);
        };
      });
    },
    async stop() {
      running.delete(handle);
      if (child.exitCode !== null || child.signalCode !== null) return child.exitCode;
      child.kill("SIGTERM");
      const [code] = await exited;
      return code;
    },
    async kill() {
      running.delete(handle);
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.kill("SIGKILL");
      await exited;
    },
  };
  running.add(handle);
  return handle;
}

/** Kills every service process still running (for afterAll). */
export async function killAllServices(): Promise<void> {
  await Promise.all([...running].map((s) => s.kill()));
}

/** The folder of a fixture tools set under test/fixtures. */
export function fixtureTools(name: string): string {
  return join(ROOT, "test", "fixtures", name);
}

/**
 * Resolves once every resolver of `resolver`'s mesh (its server and prefix, reached as it
 * reaches them) finds every named tool, as a call would, whichever resolver takes it
 * ({@link toolKnown}). Waits up to 60 s, a loaded machine's worst case for a registration to
 * travel from executor or bridge to resolver.
 */
export async function toolAvailable(resolver: ServiceProcess, ...names: string[]): Promise<void> {
  // Connected as the resolver is (its server, credentials and TLS files), to its prefix.
  const config = loadConfig(resolver.env);
  const nc = await connectNats(config.nats);
  try {
    const client = new ToolmeshClient(nc, { prefix: config.prefix });
    await Promise.all(names.map((name) => toolKnown(client, name, true, 60_000)));
  } finally {
    await nc.close();
  }
}

/**
 * Dry runs in a row that must all agree before {@link toolKnown} believes them. The resolvers
 * answer dry runs in one queue group, each from its own registry: a single answer speaks for
 * one resolver only. With one of three resolvers behind, 24 answers in a row all miss it once
 * in 16 000 tries; with one of two, once in 16 million.
 */
const AGREEING_ANSWERS = 24;

/**
 * Waits until the resolvers know `name` (`known`) or no longer do, as a call would find it,
 * whichever resolver takes it: {@link AGREEING_ANSWERS} dry runs of it in a row are answered,
 * and `unknown_tool` or not (`unavailable`, a resolver not answering, is neither and starts
 * the run again). Reads the resolvers' state, not their logs. Waits up to `timeoutMs`.
 */
export async function toolKnown(
  client: ToolmeshClient,
  name: string,
  known: boolean,
  timeoutMs = 15_000,
): Promise<void> {
  const agrees = async (): Promise<boolean> => {
    const reply = await client.resolve("tool-known-probe", { name, arguments: {} });
    if (!reply.ok && reply.error.code === ErrorCode.Unavailable) return false;
    const unknown = !reply.ok && reply.error.code === ErrorCode.UnknownTool;
    return unknown === !known;
  };
  await eventually(
    `${name} to be ${known ? "known" : "unknown"} to every resolver`,
    async () => {
      for (let answers = 0; answers < AGREEING_ANSWERS; answers++)
        if (!(await agrees())) return undefined;
      return true;
    },
    { timeoutMs },
  );
}

/** A resolver and an executor of the `tools-rel` fixture tools, their ledger in a folder of its own. */
export interface LedgerMesh {
  resolver: ServiceProcess;
  executor: ServiceProcess;
  /** Where the ledger tools record their side effects; the caller removes it. */
  ledgerDir: string;
}

/**
 * Starts a {@link LedgerMesh} on the server at `natsUrl` with a 1 s ack wait, and waits until the
 * resolver has `tool`.
 */
export async function startLedgerMesh(natsUrl: string, tool: string): Promise<LedgerMesh> {
  const ledgerDir = await mkdtemp(join(tmpdir(), "toolmesh-ledger-"));
  const env = {
    NATS_URL: natsUrl,
    TOOLMESH_TOOLS_DIR: fixtureTools("tools-rel"),
    TOOLMESH_TOOLKIT_CONTEXT: JSON.stringify({ ledgerDir }),
    TOOLMESH_ACK_WAIT_MS: "1000",
  };
  const resolver = await startService("resolver", env);
  const executor = await startService("executor", env);
  await toolAvailable(resolver, tool);
  return { resolver, executor, ledgerDir };
}
