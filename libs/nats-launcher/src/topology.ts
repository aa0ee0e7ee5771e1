/**
 * Clusters and leaf nodes of local `nats-server` processes, built on {@link startNatsServer}:
 * each node has its own random client and monitoring ports and its own JetStream store, and
 * can be killed and restarted on the same ports like a single server.
 */
import { createServer } from "node:net";
import { setTimeout as delay } from "node:timers/promises";
import type { NatsConnection } from "@nats-io/nats-core";
import type { NatsServerHandle, StartNatsServerOptions } from "./local-server.js";
import { startNatsServer } from "./local-server.js";

/** A node of a {@link NatsClusterHandle}: a server with its `--server_name`. */
export type NatsClusterNode = NatsServerHandle & { readonly name: string };

/** Options of {@link startNatsCluster}. */
export interface StartNatsClusterOptions {
  /** Number of servers. Default 3. */
  size?: number;
  /** `--cluster_name`. Default `toolmesh-test`. */
  name?: string;
  /** Extra configuration file text for every node. */
  config?: string;
  /** How long to wait for the cluster to become healthy, in ms. Default 30 000. */
  startTimeoutMs?: number;
  /** The nats-server binary of every node: a path, or a name looked up on PATH. */
  executable?: string;
}

/** A running local cluster. */
export interface NatsClusterHandle {
  readonly nodes: readonly NatsClusterNode[];
  /** Every node's client URL, comma-separated (what `NATS_URL` takes). */
  readonly urls: string;
  /** The node with this `--server_name`; throws for an unknown name. */
  node(name: string): NatsClusterNode;
  /**
   * Resolves once every running node answers `/healthz` with 200: it knows the JetStream meta
   * leader and its streams and consumers are current.
   */
  waitHealthy(timeoutMs?: number): Promise<void>;
  /** Stops every node and deletes their stores. */
  stop(): Promise<void>;
}

const HOST = "127.0.0.1";
const POLL_MS = 50;

/** A TCP port free on 127.0.0.1 right now (for ports other servers must know in advance). */
export async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, HOST, resolve);
  });
  const address = server.address();
  await new Promise<void>((resolve) => server.close(() => resolve()));
  if (address === null || typeof address === "string") throw new Error("no port assigned");
  return address.port;
}

async function status(url: string): Promise<number | undefined> {
  try {
    const res = await fetch(url, { signal: AbortSignal.timeout(2_000) });
    await res.arrayBuffer();
    return res.status;
  } catch {
    return undefined;
  }
}

async function waitFor(what: string, timeoutMs: number, ok: () => Promise<boolean>): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await ok())) {
    if (Date.now() > deadline) throw new Error(`${what} within ${timeoutMs} ms`);
    await delay(POLL_MS);
  }
}

/**
 * Starts `size` servers with JetStream, each with `--server_name`, its own store, and routes to
 * every other node, and resolves once the cluster is healthy (a JetStream meta leader elected).
 */
export async function startNatsCluster(
  options: StartNatsClusterOptions = {},
): Promise<NatsClusterHandle> {
  const size = options.size ?? 3;
  const clusterName = options.name ?? "toolmesh-test";
  // A route port is chosen free and bound by nats-server a moment later: another process may
  // take it in between. The cluster then starts again on ports chosen afresh.
  for (let attempt = 1; ; attempt++) {
    const ports: number[] = [];
    for (let i = 0; i < size; i++) ports.push(await freePort());
    try {
      return await startClusterOn(ports, clusterName, options);
    } catch (err) {
      if (attempt >= 3 || !String(err).includes("address already in use")) throw err;
    }
  }
}

async function startClusterOn(
  ports: number[],
  clusterName: string,
  options: StartNatsClusterOptions,
): Promise<NatsClusterHandle> {
  const route = (port: number): string => `nats-route://${HOST}:${String(port)}`;
  const started = await Promise.allSettled(
    ports.map(async (port, i) => {
      const name = `n${String(i + 1)}`;
      const others = ports.filter((p) => p !== port).map(route);
      const args = ["--server_name", name, "--cluster_name", clusterName];
      args.push("--cluster", route(port), "--routes", others.join(","));
      const serverOptions: StartNatsServerOptions = { args };
      if (options.config !== undefined) serverOptions.config = options.config;
      if (options.executable !== undefined) serverOptions.executable = options.executable;
      const server = await startNatsServer(serverOptions);
      return Object.assign(server, { name });
    }),
  );
  const nodes = started.flatMap((r) => (r.status === "fulfilled" ? [r.value] : []));
  const failed = started.find((r) => r.status === "rejected");
  if (failed !== undefined) {
    await Promise.all(nodes.map((n) => n.stop()));
    throw failed.reason;
  }
  const cluster: NatsClusterHandle = {
    nodes,
    urls: nodes.map((n) => n.url).join(","),
    node(name) {
      const found = nodes.find((n) => n.name === name);
      if (found === undefined) throw new Error(`no node named ${name}`);
      return found;
    },
    async waitHealthy(timeoutMs = 30_000) {
      await waitFor("the cluster did not become healthy", timeoutMs, async () => {
        const running = nodes.filter((n) => n.running);
        const codes = await Promise.all(running.map((n) => status(`${n.monitorUrl}/healthz`)));
        return codes.every((c) => c === 200);
      });
    },
    async stop() {
      await Promise.all(nodes.map((n) => n.stop()));
    },
  };
  try {
    await cluster.waitHealthy(options.startTimeoutMs);
  } catch (err) {
    await cluster.stop();
    throw err;
  }
  return cluster;
}

interface StreamInfoReply {
  cluster?: { leader?: string; replicas?: { name: string; current: boolean }[] };
  error?: { code: number; description: string };
}

async function jsApi(nc: NatsConnection, subject: string): Promise<StreamInfoReply> {
  const reply = await nc.request(subject, undefined, { timeout: 2_000 });
  return reply.json<StreamInfoReply>();
}

/** The `--server_name` of a stream's leader (`$JS.API.STREAM.INFO`); undefined while none. */
export async function streamLeader(
  nc: NatsConnection,
  stream: string,
): Promise<string | undefined> {
  const info = await jsApi(nc, `$JS.API.STREAM.INFO.${stream}`).catch(() => undefined);
  return info?.cluster?.leader;
}

/**
 * Waits until the stream has a leader — other than `not`, when given (a node just killed or
 * stepped down) — and returns its name.
 */
export async function waitForStreamLeader(
  nc: NatsConnection,
  stream: string,
  timeoutMs = 30_000,
  not?: string,
): Promise<string> {
  let leader: string | undefined;
  const what = not === undefined ? "no leader" : `no leader other than ${not}`;
  await waitFor(`stream ${stream} elected ${what}`, timeoutMs, async () => {
    leader = await streamLeader(nc, stream);
    return leader !== undefined && leader !== not;
  });
  return leader as string;
}

/**
 * Asks a stream's leader to step down (`$JS.API.STREAM.LEADER.STEPDOWN`) and waits until
 * another node leads it. Returns the old and the new leader.
 */
export async function stepDownStreamLeader(
  nc: NatsConnection,
  stream: string,
  timeoutMs = 30_000,
): Promise<{ from: string; to: string }> {
  const from = await waitForStreamLeader(nc, stream, timeoutMs);
  const reply = await jsApi(nc, `$JS.API.STREAM.LEADER.STEPDOWN.${stream}`);
  if (reply.error !== undefined)
    throw new Error(`step-down of ${stream} refused: ${reply.error.description}`);
  return { from, to: await waitForStreamLeader(nc, stream, timeoutMs, from) };
}

/**
 * Lets JetStream API requests and KV writes (`$JS.API.>`, `$KV.>`) of the default account cross
 * leaf connections, to the hub's JetStream, without a JetStream domain: nats-server 2.9 denies
 * them otherwise. Both sides need it.
 */
const EXTEND_JETSTREAM = 'default_js_domain: { "$G": "" }';

/** A server that accepts leaf-node connections. */
export type LeafHubHandle = NatsServerHandle & {
  /** Where leaf nodes connect: `nats-leaf://127.0.0.1:<port>`. */
  readonly leafnodeUrl: string;
};

/** Starts a server (JetStream on) that accepts leaf nodes on a port of its own. */
export async function startLeafHub(options: StartNatsServerOptions = {}): Promise<LeafHubHandle> {
  const port = await freePort();
  const server = await startNatsServer({
    ...options,
    config: `${options.config ?? ""}\n${EXTEND_JETSTREAM}\nleafnodes { listen: "${HOST}:${String(port)}" }\n`,
  });
  return Object.assign(server, { leafnodeUrl: `nats-leaf://${HOST}:${String(port)}` });
}

/**
 * Starts a leaf server that connects to `remoteUrl` (a hub's `leafnodeUrl`, or anything that
 * forwards to it). It runs without JetStream of its own, so its clients' JetStream API requests
 * travel to the hub. Resolves once the leaf connection is up.
 */
export async function startLeafNode(
  remoteUrl: string,
  options: StartNatsServerOptions = {},
): Promise<NatsServerHandle> {
  const server = await startNatsServer({
    ...options,
    jetstream: false,
    config: `${options.config ?? ""}\n${EXTEND_JETSTREAM}\nleafnodes { reconnect: 1, remotes: [ { url: "${remoteUrl}" } ] }\n`,
  });
  await waitForLeafConnections(server, 1);
  return server;
}

/** Leaf connections a server has right now (`/leafz`). */
export async function leafConnections(server: NatsServerHandle): Promise<number> {
  try {
    const res = await fetch(`${server.monitorUrl}/leafz`, { signal: AbortSignal.timeout(2_000) });
    const body = (await res.json()) as { leafnodes?: number };
    return body.leafnodes ?? 0;
  } catch {
    return 0;
  }
}

/** Waits until the server has exactly `count` leaf connections. */
export async function waitForLeafConnections(
  server: NatsServerHandle,
  count: number,
  timeoutMs = 30_000,
): Promise<void> {
  await waitFor(`no ${String(count)} leaf connections`, timeoutMs, async () => {
    return (await leafConnections(server)) === count;
  });
}
