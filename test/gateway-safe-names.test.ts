import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { mkdtemp, readFile, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { CallToolResult, Client, Tool } from "@modelcontextprotocol/client";
import { z } from "zod";
import { keyDigest } from "@toolmesh/gateway";
import { safeToolName } from "@toolmesh/protocol";
import { mcpClient, startGateway } from "./helpers/gateway.js";
import { fixtureTools, killAllServices, startService, toolAvailable } from "./helpers/mesh.js";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";

// The gateway serving provider-safe tool names (per endpoint with `?names=provider_safe`, per
// credential with a keys file's `names`) to MCP clients of both eras: tools with dotted, long and
// prefix-sharing names listed, formatted for OpenAI and Anthropic, and every call mapped back to
// the tool it names; progress, cancellation, tasks and typed errors naming the safe names.

const MODERN = "2026-07-28";
type Era = "legacy" | typeof MODERN;
const LONG =
  "openapi.petstore_v3.operations.find_pets_by_status_and_tags_with_pagination_and_sorting";
/** The fixture's tools (test/fixtures/tools-names-gateway); `calc.mul` requires `a` and `b`. */
const NAMES = [
  "petstore.showPetById",
  "everything.get-sum",
  "calc.add",
  "calc.mul",
  "mcp:git/log",
  LONG,
  `${LONG}.v2`,
  "plain_name",
];
// The patterns the providers document for function (OpenAI) and tool (Anthropic) names.
const OPENAI_FUNCTION_NAME = /^[a-zA-Z0-9_-]{1,64}$/;
const ANTHROPIC_TOOL_NAME = /^[a-zA-Z0-9_-]{1,64}$/;
const KEY_PLAIN = "key-names-plain-0123456789";
const KEY_SAFE = "key-names-safe-0123456789";

const TaskShape = z.object({ taskId: z.string(), status: z.string() }).loose();
const CreateTask = z.object({ task: TaskShape }).loose();
const Structured = z
  .object({ code: z.string(), message: z.string(), details: z.record(z.string(), z.unknown()) })
  .loose();

let server: NatsServerHandle;
let gateway: { url: string };
let ledger: string;
const clients: Client[] = [];

beforeAll(async () => {
  server = await startNatsServer();
  ledger = await mkdtemp(join(tmpdir(), "toolmesh-safe-names-"));
  const keysFile = join(ledger, "keys.yaml");
  await writeFile(
    keysFile,
    [
      "keys:",
      `  - sha256: ${keyDigest(KEY_PLAIN)}`,
      "    tenant: acme",
      `  - sha256: ${keyDigest(KEY_SAFE)}`,
      "    tenant: acme",
      "    names: provider_safe",
      "",
    ].join("\n"),
  );
  const env = {
    NATS_URL: server.url,
    TOOLMESH_TOOLS_DIR: fixtureTools("tools-names-gateway"),
    TOOLMESH_TOOLKIT_CONTEXT: JSON.stringify({ ledgerDir: ledger }),
  };
  const [resolver] = await Promise.all([
    startService("resolver", env, 60_000),
    startService("schema-expander", env, 60_000),
    startService("executor", env, 60_000),
  ]);
  await toolAvailable(resolver, ...NAMES);
  gateway = await startGateway({ ...env, TOOLMESH_GATEWAY_KEYS_FILE: keysFile });
}, 150_000);

afterAll(async () => {
  await Promise.all(clients.map((c) => c.close().catch(() => undefined)));
  await killAllServices();
  await server?.stop();
});

async function client(era: Era, key: string, query = "?names=provider_safe"): Promise<Client> {
  const c = await mcpClient(`${gateway.url}${query}`, key, {}, era);
  clients.push(c);
  return c;
}

/** How often each tool ran (and was aborted) so far, from the tools' ledger. */
async function runs(): Promise<Map<string, number>> {
  const text = await readFile(join(ledger, "runs.log"), "utf8").catch(() => "");
  const counts = new Map<string, number>();
  for (const line of text.split("\n").filter((l) => l !== ""))
    counts.set(line, (counts.get(line) ?? 0) + 1);
  return counts;
}

const text = (result: CallToolResult): string => (result.content[0] as { text: string }).text;
const reached = (result: CallToolResult): string => {
  expect(result.isError, text(result)).toBeFalsy();
  return (JSON.parse(text(result)) as { tool: string }).tool;
};

/** A tool list in OpenAI's Chat Completions `tools` format, built from MCP tools. */
const openaiTools = (tools: Tool[]) =>
  tools.map((t) => ({
    type: "function" as const,
    function: { name: t.name, description: t.description, parameters: t.inputSchema },
  }));
/** A tool list in Anthropic's Messages `tools` format, built from MCP tools. */
const anthropicTools = (tools: Tool[]) =>
  tools.map((t) => ({ name: t.name, description: t.description, input_schema: t.inputSchema }));

/** A task-augmented tools/call; 2026-07-28 on the wire (the SDK client has no Tasks runtime). */
async function taskCall(
  era: Era,
  c: Client,
  name: string,
  args: Record<string, unknown>,
): Promise<z.infer<typeof CreateTask>> {
  if (era === "legacy") {
    const params = { name, arguments: args, task: { ttl: 60_000 } };
    return c.request({ method: "tools/call", params }, CreateTask);
  }
  const response = await fetch(`${gateway.url}?names=provider_safe`, {
    method: "POST",
    headers: {
      authorization: `Bearer ${KEY_PLAIN}`,
      accept: "application/json, text/event-stream",
      "content-type": "application/json",
      "mcp-protocol-version": MODERN,
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
        task: { ttl: 60_000 },
        _meta: {
          "io.modelcontextprotocol/protocolVersion": MODERN,
          "io.modelcontextprotocol/clientInfo": { name: "raw", version: "1" },
          "io.modelcontextprotocol/clientCapabilities": {
            extensions: { "io.modelcontextprotocol/tasks": {} },
          },
        },
      },
    }),
  });
  const body = (await response.json()) as { result?: unknown; error?: unknown };
  if (body.result === undefined) throw new Error(JSON.stringify(body));
  return CreateTask.parse(body.result);
}

/** Polls tasks/get until the task ends; the ended task (with its result in 2026-07-28). */
async function ended(c: Client, taskId: string): Promise<Record<string, unknown>> {
  const Ended = TaskShape.extend({ statusMessage: z.string().optional() }).loose();
  for (let i = 0; i < 200; i += 1) {
    const task = await c.request({ method: "tasks/get", params: { taskId } }, Ended);
    if (task.status !== "working") return task;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error(`task ${taskId} did not end`);
}

describe.each<Era>(["legacy", MODERN])("provider-safe names for a %s client", (era) => {
  it("lists safe names that OpenAI and Anthropic accept, and calls each tool by its own", async () => {
    const c = await client(era, KEY_PLAIN);
    const { tools } = await c.listTools();
    const names = tools.map((t) => t.name);
    expect(names.sort()).toEqual(NAMES.map(safeToolName).sort());
    expect(new Set(names).size).toBe(NAMES.length);
    for (const name of openaiTools(tools).map((t) => t.function.name))
      expect(name).toMatch(OPENAI_FUNCTION_NAME);
    for (const name of anthropicTools(tools).map((t) => t.name))
      expect(name).toMatch(ANTHROPIC_TOOL_NAME);
    // The long names share their first 64 characters: their safe names differ by a hash suffix.
    const long = names.filter((n) => n.startsWith(LONG.slice(0, 40).replaceAll(".", "_")));
    expect(long.map((n) => n.length)).toEqual([64, 64]);
    // Full schemas come with the safe names (described by the mesh name behind each).
    const mul = tools.find((t) => t.name === "calc_mul");
    expect(mul?.inputSchema.required).toEqual(["a", "b"]);

    const before = await runs();
    const callable = tools.filter((t) => t.name !== "calc_mul");
    const answers = await Promise.all(
      callable.map((t) => c.callTool({ name: t.name, arguments: { note: era } })),
    );
    // Each call by a safe name ran the tool the list described under it, once.
    expect(answers.map(reached)).toEqual(
      callable.map((t) => NAMES.find((n) => safeToolName(n) === t.name)),
    );
    const after = await runs();
    for (const name of NAMES.filter((n) => n !== "calc.mul"))
      expect((after.get(name) ?? 0) - (before.get(name) ?? 0), name).toBe(1);
    expect(after.get("calc.mul")).toBe(before.get("calc.mul"));
  });

  it("answers missing arguments and unknown tools with typed errors naming safe names", async () => {
    const c = await client(era, KEY_PLAIN);
    const missing = await c.callTool({ name: "calc_mul", arguments: { a: 2 } });
    expect(missing.isError).toBe(true);
    const error = Structured.parse(missing.structuredContent);
    expect(error.code).toBe("missing_arguments");
    expect(error.details).toMatchObject({ tool: "calc_mul", missing_required: ["b"] });
    expect(error.message).toBe('tool "calc_mul" is missing required argument: b');
    // The text a model reads names what to call again, and the schema to call it with.
    expect(text(missing)).toContain('tool "calc_mul"');
    expect(text(missing)).toContain('"required":["a","b"]');
    expect(text(missing)).not.toContain("calc.mul");

    const unknown = await c.callTool({ name: "calc_ad", arguments: {} });
    const refused = Structured.parse(unknown.structuredContent);
    expect(refused.code).toBe("unknown_tool");
    expect(refused.details.close_matches).toContain("calc_add");
    expect(JSON.stringify(refused)).not.toContain("calc.add");
    // The mesh name still reaches its tool: a client may call by either.
    expect(reached(await c.callTool({ name: "calc.add", arguments: {} }))).toBe("calc.add");
  });

  it("streams progress and cancels a call made by a safe name", async () => {
    const c = await client(era, KEY_PLAIN);
    const seen: number[] = [];
    const done = await c.callTool(
      { name: "mcp_git_log", arguments: { ms: 200 } },
      { onprogress: (p) => seen.push(p.progress) },
    );
    expect(reached(done)).toBe("mcp:git/log");
    expect(seen.length).toBeGreaterThan(0);

    const abort = new AbortController();
    const before = (await runs()).get("aborted everything.get-sum") ?? 0;
    const started = new Promise<void>((resolve) => {
      void c
        .callTool(
          { name: "everything_get-sum", arguments: { ms: 60_000 } },
          { signal: abort.signal, onprogress: () => resolve() },
        )
        .catch(() => undefined);
    });
    await started;
    abort.abort();
    await expect
      .poll(async () => (await runs()).get("aborted everything.get-sum") ?? 0, { timeout: 20_000 })
      .toBe(before + 1);
  });

  it("runs a task made by a safe name, and names the safe name in its failure", async () => {
    const c = await client(era, KEY_PLAIN);
    const created = await taskCall(era, c, "petstore_showPetById", { ms: 100 });
    const done = await ended(c, created.task.taskId);
    expect(done.status).toBe("completed");
    const result =
      era === "legacy"
        ? await c.request(
            { method: "tasks/result", params: { taskId: created.task.taskId } },
            z.object({ content: z.array(z.object({ text: z.string() }).loose()) }).loose(),
          )
        : (done.result as CallToolResult);
    expect(reached(result as CallToolResult)).toBe("petstore.showPetById");

    // An invalid call is answered with a task that has already failed (the mesh kept no record).
    const failed = (await taskCall(era, c, "calc_mul", { b: 1 })).task;
    expect(failed.status).toBe("failed");
    expect(failed.statusMessage).toBe(
      'missing_arguments: tool "calc_mul" is missing required argument: a',
    );
  });

  it("serves safe names to a credential that asks for them, mesh names where it says so", async () => {
    const byKey = await client(era, KEY_SAFE, "");
    expect((await byKey.listTools()).tools.map((t) => t.name)).toContain("calc_add");
    expect(reached(await byKey.callTool({ name: "calc_add", arguments: {} }))).toBe("calc.add");
    const meshByQuery = await client(era, KEY_SAFE, "?names=mesh");
    expect((await meshByQuery.listTools()).tools.map((t) => t.name).sort()).toEqual(
      [...NAMES].sort(),
    );
    const plain = await client(era, KEY_PLAIN, "");
    expect((await plain.listTools()).tools.map((t) => t.name)).toContain("calc.add");
    const mesh = await plain.callTool({ name: "calc.mul", arguments: {} });
    expect(Structured.parse(mesh.structuredContent).details.tool).toBe("calc.mul");
  });
});

describe("the names query parameter", () => {
  it("refuses a value it does not know, saying which it takes", async () => {
    const response = await fetch(`${gateway.url}?names=safe`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${KEY_PLAIN}`,
        accept: "application/json, text/event-stream",
        "content-type": "application/json",
      },
      body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "tools/list", params: {} }),
    });
    expect(response.status).toBe(400);
    expect(await response.json()).toMatchObject({
      error: { message: "the names query parameter must be mesh or provider_safe" },
    });
  });
});
