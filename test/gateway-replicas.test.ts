import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Client } from "@modelcontextprotocol/sdk/client/index.js";
import type { CallToolResult, Task } from "@modelcontextprotocol/sdk/types.js";
import { CallToolResultSchema, CreateTaskResultSchema } from "@modelcontextprotocol/sdk/types.js";
import { META_IDEMPOTENCY_KEY } from "@toolmesh/gateway";
import {
  KEYS,
  gatewayAgents,
  gatewayTools,
  mcpClient,
  startGateway,
  tallies,
  writeKeysFile,
} from "./helpers/gateway.js";
import { killAllServices, startService, toolAvailable } from "./helpers/mesh.js";
import type { ServiceProcess } from "./helpers/mesh.js";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import type { RoundRobinProxy } from "./helpers/round-robin-proxy.js";
import { startRoundRobinProxy } from "./helpers/round-robin-proxy.js";

// Three gateway replicas behind a round-robin balancer with no session affinity: every request
// of one MCP client may reach another replica, a replica may die mid-call, and tasks are answered
// from the mesh's call store whichever replica is asked, across restarts.

let server: NatsServerHandle;
let env: Record<string, string>;
let gatewayEnv: Record<string, string>;
let tools: string;
let executor: ServiceProcess;
let replicas: { process: ServiceProcess; url: string; port: number }[];
let proxy: RoundRobinProxy;
const clients: Client[] = [];

async function client(key: string = KEYS.acme): Promise<Client> {
  const c = await mcpClient(proxy.url, key);
  clients.push(c);
  return c;
}

const text = (result: unknown): string =>
  ((result as CallToolResult).content[0] as { text: string }).text;

async function createTask(c: Client, name: string, args: Record<string, unknown>): Promise<Task> {
  const created = await c.request(
    { method: "tools/call", params: { name, arguments: args, task: { ttl: 60_000 } } },
    CreateTaskResultSchema,
  );
  return created.task;
}

/** Polls a task (through the balancer, so any replica answers) until it reaches `status`. */
async function waitForTask(
  c: Client,
  taskId: string,
  status: Task["status"],
  timeoutMs = 30_000,
): Promise<Task> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const task = await c.experimental.tasks.getTask(taskId);
    if (task.status === status) return task;
    if (Date.now() > until) throw new Error(`task ${taskId} is ${task.status}, not ${status}`);
    await new Promise((resolve) => setTimeout(resolve, task.pollInterval ?? 200));
  }
}

/** Waits until `tally` started for some key `count` times in all (it records at start). */
async function tallyStarted(count: number): Promise<void> {
  const until = Date.now() + 20_000;
  for (;;) {
    const total = [...(await tallies(tools)).values()].reduce((a, b) => a + b, 0);
    if (total >= count) return;
    if (Date.now() > until) throw new Error(`tally started ${total} times, not ${count}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

async function tallyTotal(): Promise<number> {
  return [...(await tallies(tools)).values()].reduce((a, b) => a + b, 0);
}

beforeAll(async () => {
  server = await startNatsServer();
  const [toolsDir, configs, keys] = await Promise.all([
    gatewayTools(),
    gatewayAgents(),
    writeKeysFile(),
  ]);
  tools = toolsDir;
  env = {
    NATS_URL: server.url,
    TOOLMESH_TOOLS_DIR: tools,
    TOOLMESH_CONFIG_DIR: configs,
    TOOLMESH_TOOLKIT_CONTEXT: JSON.stringify({ ledgerDir: tools }),
    // A killed executor's work comes back after this long.
    TOOLMESH_ACK_WAIT_MS: "2000",
  };
  gatewayEnv = { ...env, ...keys.env, TOOLMESH_GATEWAY_KEYS_FILE: keys.file };
  let resolver: ServiceProcess;
  [resolver, executor] = await Promise.all([
    startService("resolver", env, 60_000),
    startService("executor", env, 60_000),
    startService("schema-expander", env, 60_000),
  ]);
  await toolAvailable(resolver, "echo", "tally");
  replicas = await Promise.all([0, 1, 2].map(() => startGateway(gatewayEnv)));
  proxy = await startRoundRobinProxy(replicas.map((r) => r.port));
}, 180_000);

afterAll(async () => {
  await Promise.all(clients.map((c) => c.close().catch(() => undefined)));
  await proxy?.close();
  await killAllServices();
  await server?.stop();
});

/** Restarts replica `i` on its port (after a kill or a stop). */
async function restartReplica(i: number): Promise<void> {
  const old = replicas[i] as (typeof replicas)[number];
  replicas[i] = await startGateway({ ...gatewayEnv, TOOLMESH_GATEWAY_PORT: String(old.port) });
}

describe("three replicas, no affinity", () => {
  it("serves one client's requests from every replica", async () => {
    const before = [...proxy.hits.values()];
    const c = await client();
    for (let i = 0; i < 6; i++) {
      const result = await c.callTool({ name: "echo", arguments: { text: `n${i}` } });
      expect(text(result)).toBe(`n${i}`);
    }
    expect((await c.listTools()).tools.length).toBeGreaterThan(0);
    const after = [...proxy.hits.values()];
    expect(after.every((n, i) => n > (before[i] ?? 0))).toBe(true);
  });

  it("survives a replica killed mid-call: the retry with the key is answered once", async () => {
    const c = await client();
    const key = `replica-kill-${Date.now()}`;
    const call = () =>
      c.callTool({
        name: "tally",
        arguments: { ms: 2_000 },
        _meta: { [META_IDEMPOTENCY_KEY]: key },
      });
    const before = await tallyTotal();
    const first = call();
    const failed = first.then(
      () => false,
      () => true,
    );
    await tallyStarted(before + 1);
    const [holder] = proxy.callsInFlight();
    const index = replicas.findIndex((r) => r.port === holder);
    expect(index).toBeGreaterThanOrEqual(0);
    await replicas[index]?.process.kill();
    expect(await failed).toBe(true); // the client saw its replica die
    const retried = JSON.parse(text(await call())) as { key: string; count: number };
    expect(retried.count).toBe(1);
    expect((await tallies(tools)).get(retried.key)).toBe(1);
    await restartReplica(index);
  });
});

describe("tasks", () => {
  it("answers a task from the call store on any replica, across a restart of every replica", async () => {
    const c = await client();
    const task = await createTask(c, "tally", { ms: 1_500 });
    expect(task.taskId).toMatch(/^mcp-t-/);
    expect(["working", "completed"]).toContain(task.status);
    expect(task.ttl).toBeGreaterThan(0);
    for (let i = 0; i < replicas.length; i++) {
      await replicas[i]?.process.stop();
      await restartReplica(i);
    }
    const done = await waitForTask(c, task.taskId, "completed");
    expect(done.taskId).toBe(task.taskId);
    const result = await c.experimental.tasks.getTaskResult(task.taskId, CallToolResultSchema);
    expect(JSON.parse(text(result))).toMatchObject({ count: 1 });
    const listed = await c.experimental.tasks.listTasks();
    expect(listed.tasks.map((t) => t.taskId)).toContain(task.taskId);
  });

  it("keeps a task across an executor kill: the work is run again and the task completes", async () => {
    const c = await client();
    const before = await tallyTotal();
    const task = await createTask(c, "tally", { ms: 3_000 });
    await tallyStarted(before + 1);
    await executor.kill();
    expect((await c.experimental.tasks.getTask(task.taskId)).status).toBe("working");
    executor = await startService("executor", env, 60_000);
    await waitForTask(c, task.taskId, "completed", 40_000);
    const result = await c.experimental.tasks.getTaskResult(task.taskId, CallToolResultSchema);
    expect(result.isError).toBeFalsy();
  }, 60_000);

  it("cancels a task in the mesh", async () => {
    const c = await client();
    const before = await tallyTotal();
    const task = await createTask(c, "tally", { ms: 30_000 });
    await tallyStarted(before + 1);
    const cancelled = await c.experimental.tasks.cancelTask(task.taskId);
    expect(cancelled.status).toBe("cancelled");
    expect((await c.experimental.tasks.getTask(task.taskId)).status).toBe("cancelled");
    const result = await c.experimental.tasks.getTaskResult(task.taskId, CallToolResultSchema);
    expect(result.isError).toBe(true);
    expect(result.structuredContent?.code).toBe("cancelled");
  });

  it("never shows one tenant's task to another", async () => {
    const acme = await client();
    const task = await createTask(acme, "echo", { text: "mine" });
    const globex = await client(KEYS.globex);
    await expect(globex.experimental.tasks.getTask(task.taskId)).rejects.toThrow(/not found/i);
    const listed = await globex.experimental.tasks.listTasks();
    expect(listed.tasks.map((t) => t.taskId)).not.toContain(task.taskId);
    await expect(globex.experimental.tasks.cancelTask(task.taskId)).rejects.toThrow();
  });

  it("gives a task that asks for an idempotency key the call that key names", async () => {
    const c = await client();
    const args = { ms: 10 };
    const meta = { [META_IDEMPOTENCY_KEY]: `task-key-${Date.now()}` };
    const first = await c.request(
      {
        method: "tools/call",
        params: { name: "tally", arguments: args, task: {}, _meta: meta },
      },
      CreateTaskResultSchema,
    );
    const second = await c.request(
      {
        method: "tools/call",
        params: { name: "tally", arguments: args, task: {}, _meta: meta },
      },
      CreateTaskResultSchema,
    );
    expect(second.task.taskId).toBe(first.task.taskId);
    await waitForTask(c, first.task.taskId, "completed");
    const result = await c.experimental.tasks.getTaskResult(
      first.task.taskId,
      CallToolResultSchema,
    );
    expect(JSON.parse(text(result))).toMatchObject({ count: 1 });
  });
});
