/**
 * NATS servers for the integration tests in containers, through testcontainers, as users with
 * Docker run them: `TOOLMESH_TEST_NATS=container` (see ./nats-server.ts). The image is
 * `TOOLMESH_TEST_NATS_IMAGE`, the public `nats:2.15.1-alpine` by default (as docker-compose.yml); any image whose entrypoint is
 * nats-server works. The handle behaves like the local launcher's: the same URL across
 * `kill()` and `restart()` (fixed host ports) and the same store (the container's filesystem).
 */
import { createServer } from "node:net";
import { setTimeout as delay } from "node:timers/promises";
import { NatsContainer } from "@testcontainers/nats";
import type { NatsServerHandle, StartNatsServerOptions } from "@toolmesh/nats-launcher";
import { NatsServerStartError } from "@toolmesh/nats-launcher";
import { getContainerRuntimeClient, type StartedTestContainer } from "testcontainers";

const IMAGE = process.env.TOOLMESH_TEST_NATS_IMAGE || "nats:2.15.1-alpine";
const HOST = "127.0.0.1";
const CLIENT_PORT = 4222;
const MONITOR_PORT = 8222;
const STORE_DIR = "/data";
const CONFIG_FILE = "/etc/toolmesh-test/nats-server.conf";
const LOG_LINES = 200;
const STOP_GRACE_S = 10;

/** NatsContainer on host ports chosen here, so a restarted server keeps its URL. */
class FixedPortNatsContainer extends NatsContainer {
  withFixedHostPorts(client: number, monitor: number): this {
    this.exposedPorts = []; // drop the random-port bindings the module asks for
    return this.withExposedPorts(
      { container: CLIENT_PORT, host: client },
      { container: MONITOR_PORT, host: monitor },
    );
  }
}

async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, HOST, resolve));
  const { port } = server.address() as { port: number };
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/** Command-line args as the module's withArg() takes them: a flag, then its value if any. */
function* flagPairs(args: string[]): Generator<[string, string?]> {
  for (let i = 0; i < args.length; i++) {
    const flag = args[i] as string;
    const value = args[i + 1];
    if (value !== undefined && !value.startsWith("-")) {
      yield [flag, value];
      i++;
    } else yield [flag];
  }
}

const live = new Set<ContainerNatsServer>();
let started = 0;

class ContainerNatsServer implements NatsServerHandle {
  readonly url: string;
  readonly port: number;
  readonly monitorUrl: string;
  readonly storeDir = STORE_DIR;
  #pid: number;
  #running = true;
  #removed = false;
  readonly #container: StartedTestContainer;
  readonly #log: string[];
  readonly #jetstream: boolean;
  readonly #timeoutMs: number;

  constructor(init: {
    container: StartedTestContainer;
    port: number;
    monitorPort: number;
    pid: number;
    log: string[];
    jetstream: boolean;
    timeoutMs: number;
  }) {
    this.#container = init.container;
    this.port = init.port;
    this.url = `nats://${HOST}:${init.port}`;
    this.monitorUrl = `http://${HOST}:${init.monitorPort}`;
    this.#pid = init.pid;
    this.#log = init.log;
    this.#jetstream = init.jetstream;
    this.#timeoutMs = init.timeoutMs;
  }

  get pid(): number {
    return this.#pid;
  }

  get running(): boolean {
    return this.#running;
  }

  logs(): string {
    return this.#log.join("\n");
  }

  reload(): Promise<void> {
    return Promise.reject(
      new Error("reload() needs a server process (TOOLMESH_TEST_NATS=process)"),
    );
  }

  async #docker() {
    const client = await getContainerRuntimeClient();
    return client.container.getById(this.#container.getId());
  }

  async stop(): Promise<void> {
    if (this.#removed) return;
    this.#removed = true;
    this.#running = false;
    live.delete(this);
    await this.#container.stop({ timeout: STOP_GRACE_S * 1000, remove: true });
  }

  async kill(): Promise<void> {
    if (!this.#running) return;
    const container = await this.#docker();
    await container.kill({ signal: "SIGKILL" });
    await container.wait();
    this.#running = false;
  }

  async terminate(): Promise<void> {
    if (!this.#running) return;
    const container = await this.#docker();
    await container.stop({ t: STOP_GRACE_S });
    this.#running = false;
  }

  async lameDuck(timeoutMs = 150_000): Promise<void> {
    if (!this.#running) return;
    const container = await this.#docker();
    await container.kill({ signal: "SIGUSR2" });
    const exited = container.wait().then(() => true);
    const expired = new Promise<boolean>((resolve) =>
      setTimeout(() => resolve(false), timeoutMs).unref(),
    );
    if (!(await Promise.race([exited, expired]))) await container.kill({ signal: "SIGKILL" });
    await exited;
    this.#running = false;
  }

  async restart(): Promise<void> {
    if (this.#removed) throw new Error("restart() after stop(): the container is gone");
    const container = await this.#docker();
    if (this.#running) {
      await container.stop({ t: STOP_GRACE_S });
      this.#running = false;
    }
    await container.start();
    this.#running = true;
    this.#pid = ((await container.inspect()) as { State: { Pid: number } }).State.Pid;
    await waitHealthy(this.monitorUrl, this.#jetstream, this.#timeoutMs, () => this.logs());
  }

  async jsz(): Promise<unknown> {
    const res = await fetch(`${this.monitorUrl}/jsz?consumers=true`, {
      signal: AbortSignal.timeout(2_000),
    });
    if (!res.ok) throw new Error(`GET /jsz answered ${res.status}`);
    return res.json();
  }
}

async function waitHealthy(
  monitorUrl: string,
  jetstream: boolean,
  timeoutMs: number,
  logs: () => string,
): Promise<void> {
  const url = `${monitorUrl}/healthz${jetstream ? "?js-enabled-only=true" : ""}`;
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const status = await fetch(url, { signal: AbortSignal.timeout(2_000) }).then(
      (res) => res.status,
      () => undefined,
    );
    if (status === 200) return;
    if (Date.now() > deadline) {
      throw new NatsServerStartError(`${url} did not answer 200 within ${timeoutMs} ms`, logs());
    }
    await delay(50);
  }
}

/** Starts a NATS server container; the same options and handle as the local launcher. */
export async function startContainerNatsServer(
  opts: StartNatsServerOptions = {},
): Promise<NatsServerHandle> {
  const jetstream = opts.jetstream ?? true;
  const timeoutMs = opts.startTimeoutMs ?? 60_000;
  const [port, monitorPort] = [await freePort(), await freePort()];
  const log: string[] = [];
  const name = `toolmesh-test-nats-${process.pid}-${++started}`;
  // The module starts servers with user "test"; "--user=" and "--pass=" (later flags win)
  // clear them, so clients connect to the URL alone, as with the local launcher.
  const container = new FixedPortNatsContainer(IMAGE)
    .withName(name)
    .withFixedHostPorts(port, monitorPort)
    .withArg("--user=")
    .withArg("--pass=")
    .withArg("-m", String(MONITOR_PORT))
    .withStartupTimeout(timeoutMs)
    .withLogConsumer((stream) => {
      stream.on("data", (line: string | Buffer) => {
        log.push(String(line).trimEnd());
        if (log.length > LOG_LINES) log.shift();
      });
    });
  if (jetstream) container.withJetStream().withArg("-sd", STORE_DIR);
  if (opts.config !== undefined) {
    container
      .withCopyContentToContainer([{ content: opts.config, target: CONFIG_FILE }])
      .withArg("-c", CONFIG_FILE);
  }
  for (const [flag, value] of flagPairs(opts.args ?? [])) {
    if (value === undefined) container.withArg(flag);
    else container.withArg(flag, value);
  }

  let running: StartedTestContainer;
  try {
    running = await container.start();
  } catch (err) {
    // A server that exited is left behind by testcontainers when Ryuk is off: remove it.
    const client = await getContainerRuntimeClient();
    await client.container
      .getById(name)
      .remove({ force: true })
      .catch(() => undefined);
    throw new NatsServerStartError(
      `container ${IMAGE} did not start: ${(err as Error).message}`,
      log.join("\n"),
      { cause: err },
    );
  }
  const client = await getContainerRuntimeClient();
  const inspected = (await client.container.getById(running.getId()).inspect()) as {
    State: { Pid: number };
  };
  const server = new ContainerNatsServer({
    container: running,
    port,
    monitorPort,
    pid: inspected.State.Pid,
    log,
    jetstream,
    timeoutMs,
  });
  live.add(server);
  try {
    await waitHealthy(server.monitorUrl, jetstream, timeoutMs, () => server.logs());
  } catch (err) {
    await server.stop();
    throw err;
  }
  return server;
}

/** Removes every container started here that was not stopped. */
export async function stopAllContainerNatsServers(): Promise<void> {
  await Promise.all([...live].map((server) => server.stop()));
}
