/**
 * Launches local `nats-server` processes on random ports with temporary JetStream storage:
 * for `toolmesh dev` when no server answers, and for the integration tests, which kill and
 * restart them. Modelled on nats.js's `nst/src/launcher.ts`.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { rmSync } from "node:fs";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as delay } from "node:timers/promises";

/** Options for {@link startNatsServer}. */
export interface StartNatsServerOptions {
  /** Enable JetStream with file storage under `storeDir`. Default `true`. */
  jetstream?: boolean;
  /**
   * Extra command-line arguments, appended after the launcher's own. Go's flag parsing lets a
   * later flag win, so do not pass `-a`, `-p`, `-m`, `-sd` or `--ports_file_dir`.
   */
  args?: string[];
  /**
   * Extra configuration file text (nats-server config syntax), passed with `-c`. The launcher's
   * command-line flags (listen address, ports, store dir, ports file dir) override the file.
   */
  config?: string;
  /** How long to wait for the server to become healthy, in milliseconds. Default 15000. */
  startTimeoutMs?: number;
  /** The nats-server binary: a path, or a name looked up on PATH. Default `nats-server`. */
  executable?: string;
}

/** A running (or killed, restartable) test server. */
export interface NatsServerHandle {
  /** Client URL, `nats://127.0.0.1:<port>`; the same across `restart()`. */
  readonly url: string;
  /** Client port, the same across `restart()`. */
  readonly port: number;
  /** Monitoring base URL, `http://127.0.0.1:<port>`; the same across `restart()`. */
  readonly monitorUrl: string;
  /** Store directory passed as `-sd`; the server keeps its data in `<storeDir>/jetstream`. */
  readonly storeDir: string;
  /** PID of the current server process; changes on `restart()`. */
  readonly pid: number;
  /** Whether a server process is currently running. */
  readonly running: boolean;
  /** SIGTERM (SIGKILL after 10 s), wait for exit, then delete the temp dir. Idempotent. */
  stop(): Promise<void>;
  /** SIGKILL and wait for exit; keeps the temp dir so `restart()` finds the store. */
  kill(): Promise<void>;
  /**
   * SIGTERM (SIGKILL after 10 s) and wait for exit, as a rolling restart stops a server; keeps
   * the temp dir so `restart()` finds the store.
   */
  terminate(): Promise<void>;
  /**
   * Lame-duck mode (SIGUSR2, what `nats-server --signal ldm=PID` sends and the NATS Helm chart's
   * preStop hook runs): the server stops taking clients, hands its JetStream leaderships away,
   * closes its clients over `lame_duck_duration` and exits. Resolves once it has exited (SIGKILL
   * if it is still running `timeoutMs` later, default 150 000); keeps the temp dir.
   */
  lameDuck(timeoutMs?: number): Promise<void>;
  /**
   * Start again on the same port with the same store dir and wait until healthy. A running
   * server is first stopped with SIGTERM (temp dir kept). Rejects after `stop()`.
   */
  restart(): Promise<void>;
  /** `GET /jsz?consumers=true` from the monitoring port. */
  // The monitoring JSON is wide and version-dependent; tests poke at the fields they need.
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  jsz(): Promise<any>;
  /** The last lines the server wrote to stderr (its log). */
  logs(): string;
  /**
   * Replaces the configuration file's text (the `config` option) and reloads it with SIGHUP,
   * as `nats-server --signal reload` does; resolves once the server logs the reload, rejects
   * with the server's reason when it refuses the new configuration.
   */
  reload(config: string): Promise<void>;
}

/** The server did not become healthy; `stderr` holds the tail of its log. */
export class NatsServerStartError extends Error {
  override readonly name = "NatsServerStartError";
  /** Tail of the server's stderr at the time of failure. */
  readonly stderr: string;

  constructor(message: string, stderr: string, options?: ErrorOptions) {
    super(stderr ? `${message}\n--- nats-server stderr (tail) ---\n${stderr}` : message, options);
    this.stderr = stderr;
  }
}

const EXECUTABLE = "nats-server";
const HOST = "127.0.0.1";
const DEFAULT_START_TIMEOUT_MS = 15_000;
const STOP_GRACE_MS = 10_000;
const POLL_INTERVAL_MS = 20;
const HTTP_TIMEOUT_MS = 2_000;
const STDERR_TAIL_LINES = 200;

/** Keeps the last `capacity` lines of a stream; a partial last line is kept until completed. */
class LineRing {
  readonly #capacity: number;
  readonly #lines: string[] = [];
  #partial = "";
  /** Complete lines pushed so far, including those that left the ring. */
  #total = 0;

  constructor(capacity: number) {
    this.#capacity = capacity;
  }

  push(chunk: string): void {
    const parts = (this.#partial + chunk).split("\n");
    this.#partial = parts.pop() ?? "";
    for (const line of parts) {
      this.#total += 1;
      this.#lines.push(line);
      if (this.#lines.length > this.#capacity) this.#lines.shift();
    }
  }

  get total(): number {
    return this.#total;
  }

  /** The complete lines pushed after the first `total` ones (those still in the ring). */
  since(total: number): string[] {
    return this.#lines.slice(Math.max(0, this.#lines.length - (this.#total - total)));
  }

  text(): string {
    const all = this.#partial ? [...this.#lines, this.#partial] : this.#lines;
    return all.join("\n");
  }
}

interface Ports {
  nats: string[];
  monitoring?: string[];
}

interface Exit {
  code: number | null;
  signal: NodeJS.Signals | null;
  error?: Error;
}

interface Proc {
  executable: string;
  child: ChildProcess;
  exited: Promise<Exit>;
  exit: Exit | undefined;
}

/** Servers whose temp dir still exists, for `stopAll()` and the process-exit safety net. */
const live = new Set<NatsServer>();
let exitHookInstalled = false;

function destroyAllSync(): void {
  for (const server of live) server.destroySync();
}

/**
 * Last resort if a test forgets stop(): no server outlives the test process. Vitest ends its
 * fork workers with SIGTERM, which skips "exit" handlers, so the signals are hooked too; the
 * signal is re-raised afterwards so the default "die by signal" still happens, unless
 * someone else has a handler for it.
 */
function installExitHook(): void {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  process.once("exit", destroyAllSync);
  for (const signal of ["SIGTERM", "SIGINT", "SIGHUP"] as const) {
    process.once(signal, () => {
      destroyAllSync();
      if (process.listenerCount(signal) === 0) process.kill(process.pid, signal);
    });
  }
}

function spawnServer(executable: string, args: string[], log: LineRing): Proc {
  const child = spawn(executable, args, { stdio: ["ignore", "ignore", "pipe"] });
  // Always drain stderr: a full pipe would block the server.
  child.stderr?.setEncoding("utf8");
  child.stderr?.on("data", (chunk: string) => log.push(chunk));
  const proc: Proc = {
    executable,
    child,
    exit: undefined,
    exited: new Promise<Exit>((resolve) => {
      // "close" (not "exit") so the last stderr lines are in the ring before anyone reads it.
      child.once("close", (code: number | null, signal: NodeJS.Signals | null) =>
        resolve({ code, signal }),
      );
      // A failed spawn (ENOENT) emits "error" and may never emit "exit".
      child.once("error", (error) => {
        if (child.pid === undefined) resolve({ code: null, signal: null, error });
      });
    }),
  };
  void proc.exited.then((exit) => {
    proc.exit = exit;
  });
  return proc;
}

function describeExit(exit: Exit, executable: string): string {
  if (exit.error) {
    const code = (exit.error as NodeJS.ErrnoException).code;
    return code === "ENOENT"
      ? `${executable} not found (install the nats-server package)`
      : `${executable} failed to spawn: ${exit.error.message}`;
  }
  return `${executable} exited early (code ${String(exit.code)}, signal ${String(exit.signal)})`;
}

async function readPorts(file: string): Promise<{ nats: string; monitoring: string } | undefined> {
  let text: string;
  try {
    text = await readFile(file, "utf8");
  } catch {
    return undefined;
  }
  try {
    const ports = JSON.parse(text) as Ports;
    const nats = ports.nats[0];
    const monitoring = ports.monitoring?.[0];
    return nats && monitoring ? { nats, monitoring } : undefined;
  } catch {
    return undefined; // caught the file half-written
  }
}

async function fetchStatus(url: string): Promise<number | undefined> {
  try {
    const res = await fetch(url, { signal: AbortSignal.timeout(HTTP_TIMEOUT_MS) });
    await res.arrayBuffer();
    return res.status;
  } catch {
    return undefined;
  }
}

class NatsServer implements NatsServerHandle {
  readonly url: string;
  readonly port: number;
  readonly monitorUrl: string;
  readonly storeDir: string;
  readonly #dir: string;
  readonly #baseArgs: string[];
  readonly #timeoutMs: number;
  readonly #jetstream: boolean;
  readonly #executable: string;
  #proc: Proc;
  #log: LineRing;
  #removed = false;

  constructor(init: {
    dir: string;
    storeDir: string;
    proc: Proc;
    log: LineRing;
    urls: { nats: string; monitoring: string };
    baseArgs: string[];
    timeoutMs: number;
    jetstream: boolean;
    executable: string;
  }) {
    this.#executable = init.executable;
    this.#dir = init.dir;
    this.storeDir = init.storeDir;
    this.#proc = init.proc;
    this.#log = init.log;
    this.url = init.urls.nats;
    this.monitorUrl = init.urls.monitoring;
    this.port = Number(new URL(this.url).port);
    this.#baseArgs = init.baseArgs;
    this.#timeoutMs = init.timeoutMs;
    this.#jetstream = init.jetstream;
  }

  get pid(): number {
    return this.#proc.child.pid ?? -1;
  }

  get running(): boolean {
    return this.#proc.exit === undefined;
  }

  logs(): string {
    return this.#log.text();
  }

  async stop(): Promise<void> {
    await this.#terminate();
    live.delete(this);
    this.#removed = true;
    await rm(this.#dir, { recursive: true, force: true });
  }

  async kill(): Promise<void> {
    if (this.running) this.#proc.child.kill("SIGKILL");
    await this.#proc.exited;
  }

  async terminate(): Promise<void> {
    await this.#terminate();
  }

  async lameDuck(timeoutMs = 150_000): Promise<void> {
    if (!this.running) return;
    this.#proc.child.kill("SIGUSR2");
    const ac = new AbortController();
    const expired = delay(timeoutMs, true, { signal: ac.signal }).catch(() => false);
    const winner = await Promise.race([this.#proc.exited.then(() => false), expired]);
    ac.abort();
    if (winner) this.#proc.child.kill("SIGKILL");
    await this.#proc.exited;
  }

  async restart(): Promise<void> {
    if (this.#removed) throw new Error("restart() after stop(): the store dir is gone");
    await this.#terminate();
    // A ports file left by a SIGKILLed server must not be mistaken for the new one's.
    await rm(join(this.#dir, `nats-server_${this.pid}.ports`), { force: true });
    const monitorPort = new URL(this.monitorUrl).port;
    const args = withPorts(this.#baseArgs, String(this.port), monitorPort);
    // Its ports were free while it was down: another process probing for a free port may hold
    // one for a moment, so a bind refusal is tried again a few times.
    for (let attempt = 1; ; attempt++) {
      this.#log = new LineRing(STDERR_TAIL_LINES);
      this.#proc = spawnServer(this.#executable, args, this.#log);
      try {
        const urls = await waitForPortsFile(this.#proc, this.#dir, this.#log, this.#timeoutMs);
        if (urls.nats !== this.url) {
          throw new NatsServerStartError(`restarted on ${urls.nats}, expected ${this.url}`, "");
        }
        await waitHealthy(this.#proc, this.monitorUrl, this.#jetstream, this.#log, this.#timeoutMs);
        return;
      } catch (err) {
        await this.kill();
        if (attempt >= 5 || !String(err).includes("address already in use")) throw err;
        await delay(200);
      }
    }
  }

  async reload(config: string): Promise<void> {
    await writeFile(join(this.#dir, "nats-server.conf"), config, "utf8");
    const before = this.#log.total;
    this.#proc.child.kill("SIGHUP");
    const deadline = Date.now() + this.#timeoutMs;
    for (;;) {
      const fresh = this.#log.since(before);
      const failed = fresh.find((line) => /Failed to reload/i.test(line));
      if (failed !== undefined) throw new Error(failed);
      if (fresh.some((line) => /Reloaded server configuration/i.test(line))) return;
      if (Date.now() > deadline) throw new Error("the server did not log a reload in time");
      await delay(POLL_INTERVAL_MS);
    }
  }

  async jsz(): Promise<unknown> {
    const res = await fetch(`${this.monitorUrl}/jsz?consumers=true`, {
      signal: AbortSignal.timeout(HTTP_TIMEOUT_MS),
    });
    if (!res.ok) throw new Error(`GET /jsz answered ${res.status}`);
    return res.json();
  }

  /** SIGKILL and delete the temp dir, synchronously; used from the process "exit" hook. */
  destroySync(): void {
    if (this.running) this.#proc.child.kill("SIGKILL");
    live.delete(this);
    this.#removed = true;
    rmSync(this.#dir, { recursive: true, force: true });
  }

  /** SIGKILL, wait, delete the temp dir; used by `stopAll()`. */
  async destroy(): Promise<void> {
    await this.kill();
    live.delete(this);
    this.#removed = true;
    await rm(this.#dir, { recursive: true, force: true });
  }

  /** SIGTERM lets JetStream flush; escalate to SIGKILL if the server hangs. */
  async #terminate(): Promise<void> {
    if (!this.running) return;
    this.#proc.child.kill("SIGTERM");
    const ac = new AbortController();
    const graceExpired = delay(STOP_GRACE_MS, true, { signal: ac.signal }).catch(() => false);
    const winner = await Promise.race([this.#proc.exited.then(() => false), graceExpired]);
    ac.abort();
    if (winner) this.#proc.child.kill("SIGKILL");
    await this.#proc.exited;
  }
}

/** Replaces the `-p` and `-m` values in the base argument list. */
function withPorts(baseArgs: string[], port: string, monitorPort: string): string[] {
  const args = [...baseArgs];
  args[args.indexOf("-p") + 1] = port;
  args[args.indexOf("-m") + 1] = monitorPort;
  return args;
}

function checkAlive(proc: Proc, log: LineRing): void {
  if (proc.exit)
    throw new NatsServerStartError(describeExit(proc.exit, proc.executable), log.text());
}

async function waitForPortsFile(
  proc: Proc,
  dir: string,
  log: LineRing,
  timeoutMs: number,
): Promise<{ nats: string; monitoring: string }> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    checkAlive(proc, log);
    const pid = proc.child.pid;
    if (pid !== undefined) {
      const urls = await readPorts(join(dir, `nats-server_${pid}.ports`));
      if (urls) return urls;
    }
    if (Date.now() > deadline) {
      throw new NatsServerStartError(`no ports file in ${dir} after ${timeoutMs} ms`, log.text());
    }
    await delay(POLL_INTERVAL_MS);
  }
}

async function waitHealthy(
  proc: Proc,
  monitorUrl: string,
  jetstream: boolean,
  log: LineRing,
  timeoutMs: number,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  const url = `${monitorUrl}/healthz${jetstream ? "?js-enabled-only=true" : ""}`;
  let status: number | undefined;
  for (;;) {
    checkAlive(proc, log);
    status = await fetchStatus(url);
    if (status === 200) break;
    if (Date.now() > deadline) {
      throw new NatsServerStartError(
        `${url} did not answer 200 within ${timeoutMs} ms (last: ${String(status)})`,
        log.text(),
      );
    }
    await delay(POLL_INTERVAL_MS);
  }
  if (!jetstream) return;
  // 2.9.10 answers healthz 200 even with JetStream off, so confirm it really is on.
  const res = await fetch(`${monitorUrl}/jsz`, { signal: AbortSignal.timeout(HTTP_TIMEOUT_MS) });
  const jsz = (await res.json()) as { disabled?: boolean };
  if (jsz.disabled) {
    throw new NatsServerStartError("JetStream was requested but is disabled", log.text());
  }
}

/**
 * Starts a `nats-server` on random client and monitoring ports bound to 127.0.0.1, with
 * JetStream storage in a fresh temp dir, and resolves once `/healthz` answers 200.
 * Call `stop()` when done (or `stopAll()` in `afterAll`).
 */
export async function startNatsServer(
  opts: StartNatsServerOptions = {},
): Promise<NatsServerHandle> {
  const jetstream = opts.jetstream ?? true;
  const timeoutMs = opts.startTimeoutMs ?? DEFAULT_START_TIMEOUT_MS;
  const dir = await mkdtemp(join(tmpdir(), "toolmesh-nats-"));
  const storeDir = join(dir, "js");

  const baseArgs: string[] = [];
  if (opts.config !== undefined) {
    const configFile = join(dir, "nats-server.conf");
    await writeFile(configFile, opts.config, "utf8");
    baseArgs.push("-c", configFile);
  }
  baseArgs.push("-a", HOST, "-p", "-1", "-m", "-1");
  if (jetstream) baseArgs.push("-js", "-sd", storeDir);
  baseArgs.push("--ports_file_dir", dir, ...(opts.args ?? []));

  installExitHook();
  const log = new LineRing(STDERR_TAIL_LINES);
  const executable = opts.executable ?? EXECUTABLE;
  const proc = spawnServer(executable, baseArgs, log);
  try {
    const urls = await waitForPortsFile(proc, dir, log, timeoutMs);
    await waitHealthy(proc, urls.monitoring, jetstream, log, timeoutMs);
    const server = new NatsServer({
      dir,
      storeDir,
      proc,
      log,
      urls,
      baseArgs,
      timeoutMs,
      jetstream,
      executable,
    });
    live.add(server);
    return server;
  } catch (err) {
    if (proc.exit === undefined) proc.child.kill("SIGKILL");
    await proc.exited;
    await rm(dir, { recursive: true, force: true });
    throw err;
  }
}

/** Kills (SIGKILL) every server started here that was not stopped, and deletes their temp dirs. */
export async function stopAll(): Promise<void> {
  await Promise.all([...live].map((server) => server.destroy()));
}
