import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { CallToolResult, Client } from "@modelcontextprotocol/client";
import { z } from "zod";
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

const TaskSchema = z
  .object({
    taskId: z.string(),
    status: z.enum(["working", "input_required", "completed", "failed", "cancelled"]),
    ttl: z.number().nullable(),
    pollInterval: z.number().optional(),
  })
  .loose();
type Task = z.infer<typeof TaskSchema>;
const CreateTaskResultSchema = z.object({ task: TaskSchema }).loose();
const ToolResultSchema = z
  .object({
    content: z.array(z.object({ type: z.string() }).loose()),
    isError: z.boolean().optional(),
    structuredContent: z.record(z.string(), z.unknown()).optional(),
  })
  .loose();

/** The 2025-11-25 task methods (the SDK v2 client has no task runtime: they go on the wire). */
function tasksOf(c: Client) {
  return {
    get: (taskId: string) => c.request({ method: "tasks/get", params: { taskId } }, TaskSchema),
    cancel: (taskId: string) =>
      c.request({ method: "tasks/cancel", params: { taskId } }, TaskSchema),
    result: async (taskId: string) =>
      (await c.request(
        { method: "tasks/result", params: { taskId } },
        ToolResultSchema,
      )) as CallToolResult,
    list: () =>
      c.request(
        { method: "tasks/list", params: {} },
        z.object({ tasks: z.array(TaskSchema) }).loose(),
      ),
  };
}

async function createTask(c: Client, name: string, args: Record<string, unknown>): Promise<Task> {
  const created = await c.request(
    { method: "tools/call", params: { name, arguments: args, task: { ttl: 60_000 } } },
    CreateTaskResultSchema,
  );
  return created.task;
}

/** A task-augmented 2026-07-28 `tools/call` on the wire, through the balancer. */
async function createModernTask(
  name: string,
  args: Record<string, unknown>,
): Promise<z.infer<typeof CreateTaskResultSchema>> {
  const response = await fetch(proxy.url, {
    method: "POST",
    headers: {
      authorization: `Bearer ${KEYS.acme}`,
      accept: "application/json, text/event-stream",
      "content-type": "application/json",
      "mcp-protocol-version": "2026-07-28",
      "mcp-method": "tools/call",
      "mcp-name": name,
    },
    body: JSON.stringify({
      jsonrpc: "2.0",
      id: 1,
      method: "tools/call",
      params: {
        name,
        arguments: args,
        task: {},
        _meta: {
          "io.modelcontextprotocol/protocolVersion": "2026-07-28",
          "io.modelcontextprotocol/clientInfo": { name: "raw", version: "1" },
          "io.modelcontextprotocol/clientCapabilities": {
            extensions: { "io.modelcontextprotocol/tasks": {} },
          },
        },
      },
    }),
  });
  return CreateTaskResultSchema.parse(((await response.json()) as { result: unknown }).result);
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
    const task = await tasksOf(c).get(taskId);
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
    const result = await tasksOf(c).result(task.taskId);
    expect(JSON.parse(text(result))).toMatchObject({ count: 1 });
    const listed = await tasksOf(c).list();
    expect(listed.tasks.map((t) => t.taskId)).toContain(task.taskId);
  });

  it("keeps a task across an executor kill: the work is run again and the task completes", async () => {
    const c = await client();
    const before = await tallyTotal();
    const task = await createTask(c, "tally", { ms: 3_000 });
    await tallyStarted(before + 1);
    await executor.kill();
    expect((await tasksOf(c).get(task.taskId)).status).toBe("working");
    executor = await startService("executor", env, 60_000);
    await waitForTask(c, task.taskId, "completed", 40_000);
    const result = await tasksOf(c).result(task.taskId);
    expect(result.isError).toBeFalsy();
  }, 60_000);

  it("keeps a 2026-07-28 task across an executor kill, polled on every replica", async () => {
    const c = await mcpClient(proxy.url, KEYS.acme, {}, "2026-07-28");
    clients.push(c);
    const before = await tallyTotal();
    const { task } = await createModernTask("tally", { ms: 3_000 });
    await tallyStarted(before + 1);
    await executor.kill();
    const hits = new Map(proxy.hits);
    // Each poll goes to the next replica: every one answers from the call store.
    for (let i = 0; i < replicas.length; i++)
      expect((await tasksOf(c).get(task.taskId)).status).toBe("working");
    for (const [port, n] of proxy.hits) expect(n).toBeGreaterThan(hits.get(port) ?? 0);
    executor = await startService("executor", env, 60_000);
    const done = await waitForTask(c, task.taskId, "completed", 40_000);
    const result = ToolResultSchema.parse((done as { result?: unknown }).result);
    expect(result.isError).toBeFalsy();
  }, 60_000);

  it("cancels a task in the mesh", async () => {
    const c = await client();
    const before = await tallyTotal();
    const task = await createTask(c, "tally", { ms: 30_000 });
    await tallyStarted(before + 1);
    const cancelled = await tasksOf(c).cancel(task.taskId);
    expect(cancelled.status).toBe("cancelled");
    expect((await tasksOf(c).get(task.taskId)).status).toBe("cancelled");
    const result = await tasksOf(c).result(task.taskId);
    expect(result.isError).toBe(true);
    expect(result.structuredContent).toMatchObject({ code: "cancelled" });
  });

  it("answers a 2026-07-28 task on any replica across a restart of every replica", async () => {
    const c = await mcpClient(proxy.url, KEYS.acme, {}, "2026-07-28");
    clients.push(c);
    const created = await createModernTask("tally", { ms: 1_500 });
    for (let i = 0; i < replicas.length; i++) {
      await replicas[i]?.process.stop();
      await restartReplica(i);
    }
    const done = await waitForTask(c, created.task.taskId, "completed");
    const result = ToolResultSchema.parse((done as { result?: unknown }).result);
    expect(JSON.parse(text(result))).toMatchObject({ count: 1 });
    const globex = await mcpClient(proxy.url, KEYS.globex, {}, "2026-07-28");
    clients.push(globex);
    const foreign = await tasksOf(globex)
      .get(created.task.taskId)
      .catch((e: unknown) => e as Error);
    const missing = await tasksOf(globex)
      .get("mcp-t-none")
      .catch((e: unknown) => e as Error);
    expect(foreign).toBeInstanceOf(Error);
    expect((foreign as Error).message.replace(created.task.taskId, "ID")).toBe(
      (missing as Error).message.replace("mcp-t-none", "ID"),
    );
  });

  it("never shows one tenant's task to another", async () => {
    const acme = await client();
    const task = await createTask(acme, "echo", { text: "mine" });
    const globex = await client(KEYS.globex);
    await expect(tasksOf(globex).get(task.taskId)).rejects.toThrow(/not found/i);
    const listed = await tasksOf(globex).list();
    expect(listed.tasks.map((t) => t.taskId)).not.toContain(task.taskId);
    await expect(tasksOf(globex).cancel(task.taskId)).rejects.toThrow();
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
    const result = await tasksOf(c).result(first.task.taskId);
    expect(JSON.parse(text(result))).toMatchObject({ count: 1 });
  });
});
