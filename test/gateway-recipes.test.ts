import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { Client } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";
import { KEYS, startGateway, writeKeysFile } from "./helpers/gateway.js";
import { fixtureTools, killAllServices, startService, toolAvailable } from "./helpers/mesh.js";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";

// The client recipes of docs/gateway.md marked "run", taken out of the page and run as written
// against the gateway in front of a real mesh (with the gateway's URL and a key filled in).

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
const PAGE = readFileSync(join(ROOT, "docs", "gateway.md"), "utf8");
const run = promisify(execFile);

/** The JavaScript recipe marked `// recipe: name` in docs/gateway.md. */
function recipe(name: string): string {
  const found = new RegExp(`\`\`\`js\\n// recipe: ${name}\\n([\\s\\S]*?)\`\`\``).exec(PAGE);
  if (found?.[1] === undefined) throw new Error(`no recipe ${name} in docs/gateway.md`);
  return found[1];
}

let server: NatsServerHandle;
let url: string;

beforeAll(async () => {
  server = await startNatsServer();
  const keys = await writeKeysFile();
  const env = { NATS_URL: server.url, TOOLMESH_TOOLS_DIR: fixtureTools("tools-a") };
  const [resolver] = await Promise.all([
    startService("resolver", env, 60_000),
    startService("executor", { ...env, TOOLMESH_TOOLS_DIR: join(ROOT, "tools", "builtin") }),
    startService("schema-expander", env, 60_000),
    // Tools whose names model providers refuse as they are (`petstore.showPetById`, …): the
    // recipes that hand names to a provider ask for provider-safe ones.
    startService("executor", { ...env, TOOLMESH_TOOLS_DIR: fixtureTools("tools-names") }),
  ]);
  await toolAvailable(resolver, "echo", "petstore.showPetById");
  ({ url } = await startGateway({ ...env, ...keys.env, TOOLMESH_GATEWAY_KEYS_FILE: keys.file }));
}, 180_000);

afterAll(async () => {
  await killAllServices();
  await server?.stop();
});

describe("docs/gateway.md recipes", () => {
  it.each([
    ["openai-agents", "assistant true true hi\n"],
    ["langchain", "hi\n"],
    ["vercel-ai", "hi\n"],
  ])("%s runs as written", async (name, printed) => {
    const { stdout } = await run(process.execPath, ["--input-type=module", "-e", recipe(name)], {
      cwd: ROOT,
      env: { PATH: process.env.PATH, TOOLMESH_MCP_URL: url, TOOLMESH_MCP_KEY: KEYS.acme },
      timeout: 60_000,
    });
    expect(stdout).toBe(printed);
  });

  it("Claude Desktop's mcp-remote command lists and calls through the gateway", async () => {
    const block =
      /```json\n(\{\n {2}"mcpServers": \{\n {4}"toolmesh": \{\n {6}"command": "npx"[\s\S]*?)```/.exec(
        PAGE,
      )?.[1];
    expect(block).toBeDefined();
    const config = JSON.parse((block ?? "").replace("URL", url).replace("KEY", KEYS.acme)) as {
      mcpServers: { toolmesh: { command: string; args: string[]; env: Record<string, string> } };
    };
    const { command, args, env } = config.mcpServers.toolmesh;
    // As Claude Desktop starts it: npx finds the mcp-remote this repository installs.
    const home = await mkdtemp(join(tmpdir(), "toolmesh-mcp-remote-"));
    const client = new Client({ name: "claude-desktop-stand-in", version: "1.0.0" });
    await client.connect(
      new StdioClientTransport({
        command,
        args,
        cwd: ROOT,
        env: { PATH: process.env.PATH ?? "", HOME: home, ...env },
        stderr: "ignore",
      }),
    );
    try {
      const { tools } = await client.listTools();
      expect(tools.map((t) => t.name)).toContain("echo");
      const result = await client.callTool({
        name: "echo",
        arguments: { text: "from Claude Desktop" },
      });
      expect(result.content[0]).toMatchObject({ type: "text", text: "from Claude Desktop" });
    } finally {
      await client.close();
    }
  });
});
