// The systems the suite compares, each started once and kept for every round:
//   R  raw NATS request-reply (a responder process),
//   J  raw JetStream: publish to a work-queue stream, pull, ack, reply (a consumer process),
//   B  BullMQ on the local Redis (add, a no-op worker process, wait for the result),
//   M  toolmesh: resolver and executor processes, `echo` calls through the TypeScript client,
// and variants of M (tracing on, two executors, extra environment such as metrics switches, and
// M+gateway: the same mesh reached by MCP clients through the gateway over Streamable HTTP, and
// M+gateway-http: the same again from a minimal JSON-RPC load client, which costs the driver far
// less than the MCP SDK client, so the gateway's own price shows apart from the SDK's).
// Every NATS system gets a nats-server of its own on random ports, so its counters are its own.
import { spawn } from "node:child_process";
import { once } from "node:events";
import { dirname, join } from "node:path";
import { Buffer } from "node:buffer";
import { Agent, request as httpRequest } from "node:http";
import { createServer } from "node:net";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { TextEncoder } from "node:util";
import { connect, headers } from "@nats-io/transport-node";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { Client as McpClient, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { ToolmeshClient } from "@toolmesh/client";
import { startNatsServer } from "@toolmesh/nats-launcher";
import { MESH_ACCOUNT, renderAccountConfig } from "@toolmesh/nats";
import { meshPlan, provisionMesh } from "@toolmesh/nats";
import { createSubjects } from "@toolmesh/protocol";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const BENCH = join(ROOT, "bench");

/** The same payload for every system: `{ text }` as an object and as JSON bytes. */
export function payloadOf(size) {
  const text = "x".repeat(size);
  return { size, text, bytes: new TextEncoder().encode(JSON.stringify({ text })) };
}

/**
 * The least an MCP client over Streamable HTTP must do (MCP 2025-11-25, "Transports"): `initialize`
 * once, `notifications/initialized`, then each `tools/call` as a POST of one JSON-RPC request
 * with the session id and protocol version the server gave, accepting JSON and event streams.
 * The gateway answers a call without a progress token as plain JSON; anything else is an error.
 * With `modern`, MCP 2026-07-28 instead: no `initialize`, each request carries the protocol
 * version, client info and capabilities in `_meta` and its method and tool name in headers.
 */
async function jsonRpcClient(url, modern = false) {
  const { hostname, port, pathname } = new URL(url);
  const agent = new Agent({ keepAlive: true, maxSockets: 64 });
  const base = {
    "content-type": "application/json",
    accept: "application/json, text/event-stream",
  };
  let headers = base;
  let id = 0;
  const post = (message) =>
    new Promise((resolve, reject) => {
      const body = JSON.stringify(message);
      const req = httpRequest(
        {
          host: hostname,
          port,
          path: pathname,
          method: "POST",
          agent,
          headers: { ...headers, "content-length": Buffer.byteLength(body) },
        },
        (res) => {
          const chunks = [];
          res.on("data", (c) => chunks.push(c));
          res.on("end", () => {
            const text = Buffer.concat(chunks).toString("utf8");
            if (res.statusCode === 202) return resolve({ res });
            if (
              res.statusCode !== 200 ||
              !String(res.headers["content-type"]).startsWith("application/json")
            )
              return reject(new Error(`gateway answered ${res.statusCode}: ${text.slice(0, 200)}`));
            resolve({ res, reply: JSON.parse(text) });
          });
          res.on("error", reject);
        },
      );
      req.on("error", reject);
      req.end(body);
    });
  const envelope = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": { name: "bench-http", version: "1" },
    "io.modelcontextprotocol/clientCapabilities": {},
  };
  if (modern)
    headers = { ...base, "mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call" };
  const init = modern
    ? undefined
    : await post({
        jsonrpc: "2.0",
        id: id++,
        method: "initialize",
        params: {
          protocolVersion: "2025-11-25",
          capabilities: {},
          clientInfo: { name: "bench-http", version: "1" },
        },
      });
  if (!modern) {
    headers = {
      ...base,
      "mcp-session-id": init.res.headers["mcp-session-id"],
      "mcp-protocol-version": init.reply.result.protocolVersion,
    };
    await post({ jsonrpc: "2.0", method: "notifications/initialized" });
  }
  return {
    async callTool(name, args) {
      if (modern) headers = { ...headers, "mcp-name": name };
      const { reply } = await post({
        jsonrpc: "2.0",
        id: id++,
        method: "tools/call",
        params: { name, arguments: args, ...(modern ? { _meta: envelope } : {}) },
      });
      if (reply.error !== undefined) throw new Error(`gateway call failed: ${reply.error.message}`);
      if (reply.result.isError)
        throw new Error(`gateway call failed: ${reply.result.content[0]?.text}`);
    },
    close: () => agent.destroy(),
  };
}

/** A TCP port no one listens on right now. */
async function freePort() {
  const probe = createServer();
  await new Promise((resolve) => probe.listen(0, "127.0.0.1", resolve));
  const { port } = probe.address();
  await new Promise((resolve) => probe.close(resolve));
  return port;
}

/** Spawns a Node child; resolves once it prints a line starting with `ready`. */
async function child(script, args, env, { logPrefix } = {}) {
  const proc = spawn(process.execPath, [script, ...args], {
    env: { PATH: process.env.PATH, ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  const lines = createInterface({ input: proc.stdout });
  const tail = [];
  proc.stderr.on("data", (d) => {
    tail.push(String(d));
    if (tail.length > 20) tail.shift();
  });
  const ready = await new Promise((resolve, reject) => {
    lines.on("line", (line) => {
      if (line.startsWith("ready")) resolve(line);
    });
    proc.once("exit", (code) =>
      reject(new Error(`${logPrefix ?? script} exited (${code}) before ready:\n${tail.join("")}`)),
    );
  });
  return { proc, ready, lines };
}

/**
 * The accounts of `toolmesh auth config --owner bench=echo,hold,needs_args,work`, plus a `driver` user with every
 * right in the mesh account (the benchmark's frontend); each password is its user's name.
 */
function accountUsers() {
  const everything = { publish: { allow: [">"] }, subscribe: { allow: [">"] } };
  const text = renderAccountConfig({
    owners: { bench: ["echo", "hold", "needs_args", "work"] },
    extraUsers: [
      { account: MESH_ACCOUNT, user: "driver", permissions: everything },
      // Counts the owner account's own messages by subject (`bench/owner.mjs --tap`).
      { account: "OWNER_bench", user: "tap", permissions: everything },
    ],
  });
  const passwords = {};
  const variables = [...text.matchAll(/user: "([^"]+)"\n\s+password: \$(\w+)/g)].map(
    ([, user, variable]) => {
      passwords[user] = user;
      return `${variable}: ${JSON.stringify(user)}`;
    },
  );
  return { config: [...variables, text].join("\n"), passwords };
}

/** A toolmesh service process (`services/<name>/dist/main.js`); ready is judged by its caller. */
function service(name, env, nodeArgs = [], root = ROOT) {
  const proc = spawn(
    process.execPath,
    [...nodeArgs, join(root, "services", name, "dist", "main.js")],
    {
      env: { PATH: process.env.PATH, TOOLMESH_LOG_LEVEL: "warn", ...env },
      stdio: ["ignore", "ignore", "inherit"],
    },
  );
  return proc;
}

async function stopProc(proc) {
  if (proc.exitCode !== null || proc.signalCode !== null) return;
  proc.kill("SIGTERM");
  const timer = setTimeout(() => proc.kill("SIGKILL"), 15_000);
  await once(proc, "exit");
  clearTimeout(timer);
}

/** R: raw NATS request-reply between two Node processes. */
export async function startRawNats() {
  const server = await startNatsServer({ jetstream: false });
  const responder = await child(join(BENCH, "peers", "nats-responder.mjs"), [], {
    NATS_URL: server.url,
  });
  const nc = await connect({ servers: server.url, noAsyncTraces: true });
  return {
    name: "R",
    title: "raw NATS request-reply",
    monitorUrl: server.monitorUrl,
    pids: () => ({ driver: process.pid, responder: responder.proc.pid, "nats-server": server.pid }),
    async call(payload) {
      await nc.request("bench.echo", payload.bytes, { timeout: 10_000 });
    },
    async stop() {
      await nc.close();
      await stopProc(responder.proc);
      await server.stop();
    },
  };
}

/** J: raw JetStream — publish to a file-backed work queue, a pull consumer acks and replies. */
export async function startRawJetStream() {
  const server = await startNatsServer();
  const nc = await connect({ servers: server.url, noAsyncTraces: true });
  const jsm = await jetstreamManager(nc);
  await jsm.streams.add({ name: "BENCH_J", subjects: ["bench.j.work"], retention: "workqueue" });
  await jsm.consumers.add("BENCH_J", { durable_name: "worker", ack_policy: "explicit" });
  const js = jetstream(nc);
  const consumer = await child(join(BENCH, "peers", "js-consumer.mjs"), [], {
    NATS_URL: server.url,
  });
  const inbox = `bench.j.reply.${process.pid}`;
  const waiting = new Map();
  let next = 0;
  // Each call's reply subject ends with its id.
  nc.subscribe(`${inbox}.*`, {
    callback: (_err, msg) => {
      const id = msg.subject.slice(inbox.length + 1);
      const done = waiting.get(id);
      waiting.delete(id);
      done?.();
    },
  });
  await nc.flush();
  return {
    name: "J",
    title: "raw JetStream publish, pull, ack",
    monitorUrl: server.monitorUrl,
    pids: () => ({ driver: process.pid, consumer: consumer.proc.pid, "nats-server": server.pid }),
    async call(payload) {
      const id = String(next++);
      const answered = new Promise((resolve) => waiting.set(id, resolve));
      const h = headers();
      h.set("reply-to", `${inbox}.${id}`);
      await js.publish("bench.j.work", payload.bytes, { headers: h });
      await answered;
    },
    async stop() {
      await nc.close();
      await stopProc(consumer.proc);
      await server.stop();
    },
  };
}

/** B: BullMQ on the shared local Redis; only this run's queue keys are removed at the end. */
export async function startBullMq({ redis = "127.0.0.1:6379" } = {}) {
  const { Queue, QueueEvents } = await import("bullmq");
  const [host, port] = redis.split(":");
  const connection = { host, port: Number(port), maxRetriesPerRequest: null };
  const queueName = `toolmesh-bench-${process.pid}-${Date.now()}`;
  const queue = new Queue(queueName, { connection });
  const events = new QueueEvents(queueName, { connection });
  queue.setMaxListeners(0); // one listener per job waited for
  await Promise.all([queue.waitUntilReady(), events.waitUntilReady()]);
  const worker = await child(join(BENCH, "peers", "bullmq-worker.mjs"), [], {
    REDIS_ADDR: redis,
    BENCH_QUEUE: queueName,
  });
  const { Redis } = await import("ioredis");
  const admin = new Redis({ host, port: Number(port) });
  const redisPid = Number(/process_id:(\d+)/.exec(await admin.info("server"))?.[1] ?? 0);
  await admin.quit();
  return {
    name: "B",
    title: "BullMQ on the local Redis",
    monitorUrl: undefined,
    pids: () => ({
      driver: process.pid,
      worker: worker.proc.pid,
      ...(redisPid > 0 ? { "redis-server (shared)": redisPid } : {}),
    }),
    async call(payload) {
      const job = await queue.add(
        "echo",
        { text: payload.text },
        // Kept a little while: waitUntilFinished looks the finished job up.
        { removeOnComplete: { age: 10 }, removeOnFail: { age: 10 } },
      );
      await job.waitUntilFinished(events, 10_000);
    },
    async stop() {
      await stopProc(worker.proc);
      await queue.obliterate({ force: true }).catch(() => undefined);
      await events.close();
      await queue.close();
    },
  };
}

/**
 * M: toolmesh. `executors` executor processes, `tracing` exports OTLP to a local sink, `env`
 * adds variables to every service (e.g. a metrics switch), `expander` also runs the schema
 * expander, `concurrency` is the executors' TOOLMESH_CONCURRENCY, `serverArgs` go to nats-server
 * and `nodeArgs` to the services' node; `root` is the checkout whose built services run.
 * `accounts` runs the server with the NATS accounts of `toolmesh auth config --owner bench=echo,hold,needs_args,work`
 * (docs/adr/0041): the executors then connect as the mesh account's `executor` (`"mesh"`) or
 * in tool owner bench's account (`"owner"`), so the two paths differ in nothing else.
 * `onServer` runs the mesh on another mesh's running nats-server (left running when this one
 * stops) and `prefix` gives it subjects of its own there (TOOLMESH_PREFIX), so two meshes share
 * the server and nothing else.
 */
export async function startMesh({
  name = "M",
  title = "toolmesh",
  executors = 1,
  tracing = false,
  env: extraEnv = {},
  expander = false,
  concurrency = 64,
  sessionMaxInFlight,
  serverArgs,
  nodeArgs = [],
  root = ROOT,
  gateway = false,
  accounts,
  prepare,
  onServer,
  prefix,
} = {}) {
  const users = accounts === undefined ? undefined : accountUsers();
  const server =
    onServer === undefined
      ? await startNatsServer({
          ...(serverArgs === undefined ? {} : { args: serverArgs }),
          ...(users === undefined ? {} : { config: users.config }),
        })
      : { ...onServer, stop: async () => {} };
  const as = (user) =>
    users === undefined ? {} : { NATS_USER: user, NATS_PASSWORD: users.passwords[user] };
  const executorEnv =
    accounts === "owner" ? { ...as("executor-bench"), TOOLMESH_OWNER: "bench" } : as("executor");
  let sink;
  const env = {
    NATS_URL: server.url,
    TOOLMESH_TOOLS_DIR: join(BENCH, "tools"),
    TOOLMESH_CONCURRENCY: String(concurrency),
    // The benchmarks measure calls, not the bound of results a tenant may have stored: at
    // thousands of calls a second the bench's tenant would reach the default within minutes.
    // `storage-flood.mjs` sets it back.
    TOOLMESH_TENANT_MAX_STORED_BYTES: "0",
    ...(prefix === undefined ? {} : { TOOLMESH_PREFIX: prefix }),
    ...(sessionMaxInFlight === undefined
      ? {}
      : { TOOLMESH_SESSION_MAX_IN_FLIGHT: String(sessionMaxInFlight) }),
    ...extraEnv,
  };
  if (tracing) {
    sink = await child(join(BENCH, "peers", "otlp-sink.mjs"), [], {});
    env.OTEL_EXPORTER_OTLP_ENDPOINT = `http://127.0.0.1:${sink.ready.split(" ")[1]}`;
  }
  if (users !== undefined) {
    // The generated users may not create the mesh's streams: `toolmesh setup`'s part.
    const admin = await connect({ servers: server.url, user: "driver", pass: "driver" });
    await provisionMesh(admin, meshPlan(createSubjects()));
    await admin.close();
  }
  if (prepare !== undefined) {
    // What `toolmesh setup` would make before the services start (e.g. a tenant's streams).
    const admin = await connect({ servers: server.url });
    await prepare(admin);
    await admin.close();
  }
  const procs = { resolver: service("resolver", { ...env, ...as("resolver") }, nodeArgs, root) };
  let gatewayUrl;
  if (gateway) {
    const port = await freePort();
    gatewayUrl = `http://127.0.0.1:${port}/mcp`;
    procs.gateway = service(
      "gateway",
      {
        ...env,
        TOOLMESH_GATEWAY_PORT: String(port),
        TOOLMESH_GATEWAY_ANONYMOUS_TENANT: "default",
        // The benchmark measures the gateway's cost, not its per-credential limits.
        TOOLMESH_GATEWAY_RATE_PER_S: "0",
        TOOLMESH_GATEWAY_MAX_CONCURRENT: "100000",
      },
      nodeArgs,
      root,
    );
  }
  for (let i = 0; i < executors; i++)
    procs[executors === 1 ? "executor" : `executor-${i + 1}`] = service(
      "executor",
      { ...env, ...executorEnv },
      nodeArgs,
      root,
    );
  if (expander) procs["schema-expander"] = service("schema-expander", env, nodeArgs, root);
  const nc = await connect({
    servers: server.url,
    noAsyncTraces: true,
    ...(users === undefined ? {} : { user: "driver", pass: users.passwords.driver }),
  });
  const client = new ToolmeshClient(nc, { defaultTimeoutMs: 30_000, prefix });
  const sessions = Array.from({ length: 16 }, (_, i) => client.session(`bench-${i}`));
  let next = 0;

  async function submit(toolName, args, options) {
    const i = next++;
    const m = await sessions[i % sessions.length].submit(
      { id: `c${i}`, name: toolName, arguments: args },
      options,
    ).result;
    if (m.error !== undefined) {
      const err = new Error(`${m.error.code}: ${m.error.message}`);
      err.code = m.error.code;
      throw err;
    }
    return m;
  }

  // Ready once an echo call goes through.
  for (;;) {
    const ok = await submit("echo", { text: "hi" }, { timeoutMs: 2_000 }).then(
      () => true,
      () => false,
    );
    if (ok) break;
  }

  // Through the gateway: MCP clients, as agent frameworks hold them (one per conversation), and
  // for `callHttp` a minimal JSON-RPC client over kept-alive HTTP connections.
  const mcpClients = [];
  const modernClients = [];
  let httpClient;
  let modernHttpClient;
  if (gatewayUrl !== undefined) {
    for (;;) {
      const res = await globalThis.fetch(gatewayUrl.replace(/mcp$/, "readyz")).catch(() => null);
      if (res?.status === 200) break;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    httpClient = await jsonRpcClient(gatewayUrl);
    // A gateway built before 2026-07-28 serving (--compare-root) has only the legacy clients.
    const discovered = await globalThis
      .fetch(gatewayUrl, {
        method: "POST",
        headers: {
          "content-type": "application/json",
          accept: "application/json, text/event-stream",
          "mcp-protocol-version": "2026-07-28",
          "mcp-method": "server/discover",
        },
        body: JSON.stringify({
          jsonrpc: "2.0",
          id: 0,
          method: "server/discover",
          params: {
            _meta: {
              "io.modelcontextprotocol/protocolVersion": "2026-07-28",
              "io.modelcontextprotocol/clientInfo": { name: "bench", version: "1" },
              "io.modelcontextprotocol/clientCapabilities": {},
            },
          },
        }),
      })
      .then((res) => res.json())
      .catch(() => ({}));
    const modern = discovered.result?.supportedVersions?.includes("2026-07-28") === true;
    if (modern) modernHttpClient = await jsonRpcClient(gatewayUrl, true);
    for (let i = 0; i < 16; i++) {
      const c = new McpClient({ name: "bench", version: "1" });
      await c.connect(new StreamableHTTPClientTransport(new URL(gatewayUrl)));
      mcpClients.push(c);
      if (!modern) continue;
      const m = new McpClient(
        { name: "bench", version: "1" },
        { versionNegotiation: { mode: { pin: "2026-07-28" } } },
      );
      await m.connect(new StreamableHTTPClientTransport(new URL(gatewayUrl)));
      modernClients.push(m);
    }
  }
  async function callThroughGateway(text, clients = mcpClients) {
    const c = clients[next++ % clients.length];
    const result = await c.callTool({ name: "echo", arguments: { text } });
    if (result.isError) throw new Error(`gateway call failed: ${result.content[0]?.text}`);
  }

  return {
    name,
    title,
    monitorUrl: server.monitorUrl,
    server,
    client,
    gatewayUrl,
    nc,
    pids: () => {
      const pids = { driver: process.pid, "nats-server": server.pid };
      for (const [role, p] of Object.entries(procs)) pids[role] = p.pid;
      return pids;
    },
    async call(payload) {
      if (gatewayUrl !== undefined) await callThroughGateway(payload.text);
      else await submit("echo", { text: payload.text });
    },
    /** Through the gateway from the minimal JSON-RPC client (a mesh started with `gateway`). */
    async callHttp(payload) {
      await httpClient.callTool("echo", { text: payload.text });
    },
    /** Whether the gateway serves MCP 2026-07-28 (the two calls below). */
    modern: () => modernClients.length > 0,
    /** Through the gateway from SDK clients pinned to MCP 2026-07-28. */
    async callModern(payload) {
      await callThroughGateway(payload.text, modernClients);
    },
    /** Through the gateway from the minimal JSON-RPC client speaking MCP 2026-07-28. */
    async callHttpModern(payload) {
      await modernHttpClient.callTool("echo", { text: payload.text });
    },
    submit,
    /** Starts one more executor replica; resolves with its role, for {@link kill}. */
    addExecutor() {
      const role = `executor-added-${Object.keys(procs).length}`;
      procs[role] = service("executor", { ...env, ...executorEnv }, nodeArgs, root);
      return role;
    },
    /** Stops a service process as a scale-down does (SIGTERM: it finishes what it runs). */
    async remove(role) {
      const proc = procs[role];
      delete procs[role];
      if (proc !== undefined) await stopProc(proc);
    },
    async stop() {
      await Promise.all(
        [...mcpClients, ...modernClients].map((c) => c.close().catch(() => undefined)),
      );
      httpClient?.close();
      modernHttpClient?.close();
      for (const s of sessions) s.close();
      await nc.close();
      await Promise.all(Object.values(procs).map(stopProc));
      let exported;
      if (sink !== undefined) {
        const line = new Promise((resolve) => sink.lines.once("line", resolve));
        sink.proc.kill("SIGTERM");
        exported = JSON.parse(await line);
      }
      await server.stop();
      return exported === undefined ? {} : { otlp_sink: exported };
    },
  };
}
