import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { Defaults } from "@toolmesh/protocol";
import { callAuthorization } from "./call-credential.js";
import {
  McpConfigError,
  loadMcpServers,
  parseServerFile,
  readSecret,
  remoteHeaders,
  stdioArgs,
  stdioEnv,
} from "./config.js";
import type { McpServerConfig } from "./config.js";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
const dirs: string[] = [];

afterAll(async () => {
  await Promise.all(dirs.map((dir) => rm(dir, { recursive: true, force: true })));
});

async function serverDir(files: Record<string, string>): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "toolmesh-mcp-config-"));
  dirs.push(dir);
  for (const [name, text] of Object.entries(files)) await writeFile(join(dir, name), text);
  return dir;
}

const STDIO = "name: local\ntransport: stdio\ncommand: node\nargs: [server.js]\n";

function remote(config: McpServerConfig): Extract<McpServerConfig, { transport: "http" | "sse" }> {
  if (config.transport === "stdio") throw new Error("expected a remote server");
  return config;
}

describe("server files", () => {
  it("parses the examples shipped in examples/mcp", async () => {
    const everything = parseServerFile(
      await readFile(join(ROOT, "examples/mcp/everything.yaml"), "utf8"),
      "everything.yaml",
    );
    expect(everything).toMatchObject({
      name: "everything",
      transport: "stdio",
      command: "node",
      lazy: false,
      connect_timeout_ms: 10_000,
      reconnect: { initial_delay_ms: 250, max_delay_ms: 30_000 },
    });
    const example = parseServerFile(
      await readFile(join(ROOT, "examples/mcp/remote.yaml.example"), "utf8"),
      "remote.yaml.example",
    );
    expect(example).toMatchObject({
      transport: "http",
      lazy: true,
      auth: { type: "api_key", header: "X-API-Key", env: "MCP_API_KEY" },
      tools: [{ name: "search", description: "Searches the knowledge base." }],
    });
  });

  it("takes the credentials a server's tools act with, and sends them as the caller's scheme", () => {
    const server = parseServerFile(
      "name: x\ntransport: http\nurl: http://h/mcp\ncredentials: { type: user-secret, scheme: Token }\n",
      "f.yaml",
    );
    expect(server.credentials).toEqual({ type: "user-secret", scheme: "Token" });
    expect(callAuthorization(server, "s3cret")).toBe("Token s3cret");
    expect(callAuthorization(server, undefined)).toBeUndefined();
    expect(callAuthorization(parseServerFile(STDIO, "f.yaml"), "s3cret")).toBeUndefined();
  });

  it("applies defaults to stdio servers", () => {
    expect(parseServerFile(STDIO, "f.yaml")).toEqual({
      name: "local",
      transport: "stdio",
      command: "node",
      args: ["server.js"],
      env: {},
      lazy: false,
      connect_timeout_ms: 10_000,
      reconnect: { initial_delay_ms: 250, max_delay_ms: 30_000 },
      internal_error: "fail",
      structured_content: "auto",
      pin_tools: false,
    });
  });

  it.each([
    ["an unknown key", `${STDIO}colour: blue\n`, "colour"],
    ["a missing command", "name: x\ntransport: stdio\n", "command"],
    ["an unknown transport", "name: x\ntransport: websocket\nurl: ws://h\n", "transport"],
    ["a name with a dot", "name: a.b\ntransport: stdio\ncommand: node\n", "name"],
    ["a non-http url", "name: x\ntransport: http\nurl: ftp://h/mcp\n", "url"],
    ["auth on a stdio server", `${STDIO}auth: { type: bearer, env: K }\n`, "auth"],
    [
      "auth with both env and file",
      "name: x\ntransport: http\nurl: http://h/mcp\nauth: { type: bearer, env: K, file: /k }\n",
      "exactly one of env",
    ],
    ["declared tools on an eager server", `${STDIO}tools: [{ name: t }]\n`, "lazy"],
    ["idle timeout on an eager server", `${STDIO}idle_timeout_ms: 1000\n`, "lazy"],
    ["YAML that does not parse", "name: [unclosed\n", "not valid YAML"],
    ["an unknown internal_error policy", `${STDIO}internal_error: sometimes\n`, "internal_error"],
    ["an unknown structured_content form", `${STDIO}structured_content: both\n`, "structured"],
    [
      "a stdio server whose tools act as their caller",
      `${STDIO}credentials: { type: token-exchange, audience: https://api.test/ }\n`,
      "credentials of type token-exchange need a server over HTTP",
    ],
    [
      "a token exchange without its audience",
      "name: x\ntransport: http\nurl: http://h/mcp\ncredentials: { type: token-exchange }\n",
      "audience",
    ],
  ])("refuses %s, naming the file", (_what, text, problem) => {
    let error: unknown;
    try {
      parseServerFile(text, "/srv/tools/mcp/bad.yaml");
    } catch (err) {
      error = err;
    }
    expect(error).toBeInstanceOf(McpConfigError);
    expect((error as Error).message).toContain("/srv/tools/mcp/bad.yaml");
    expect((error as Error).message).toContain(problem);
  });
});

describe("mcpServers JSON files", () => {
  const load = (json: unknown, env: Record<string, string> = {}) =>
    serverDir({ "clients.json": JSON.stringify(json) }).then((dir) => loadMcpServers(dir, { env }));

  it("takes a Claude Desktop / Cursor file as it is, inferring each transport", async () => {
    const servers = await load(
      {
        mcpServers: {
          filesystem: {
            command: "npx",
            args: ["-y", "@modelcontextprotocol/server-filesystem", "/data"],
            env: { DEBUG: "1" },
          },
          "remote docs": { url: "https://mcp.example.com/mcp", headers: { "X-Key": "${env:K}" } },
          legacy: { url: "https://old.example.com/sse" },
          typed: { type: "sse", url: "https://typed.example.com/events", timeout_ms: 5000 },
          off: { command: "nope", disabled: true },
          cline: { command: "node", args: ["s.js"], autoApprove: [], timeout: 60 },
        },
      },
      { K: "k" },
    );
    expect(servers.map((s) => [s.config.name, s.config.transport])).toEqual([
      ["filesystem", "stdio"],
      ["remote_docs", "http"],
      ["legacy", "sse"],
      ["typed", "sse"],
      ["cline", "stdio"],
    ]);
    const typed = servers[3]?.config;
    expect(typed?.timeout_ms).toBe(5000);
    expect(await remoteHeaders(remote(servers[1]?.config as McpServerConfig), { K: "k" })).toEqual({
      "X-Key": "k",
    });
  });

  it("takes a VS Code file (servers, type)", async () => {
    const servers = await load({
      servers: { gh: { type: "http", url: "https://api.example.com/mcp/" } },
      inputs: [],
    });
    expect(servers[0]?.config).toMatchObject({ name: "gh", transport: "http" });
  });

  it.each([
    ["no mcpServers object", { tools: {} }, 'expected an object "mcpServers"'],
    ["neither command nor url", { mcpServers: { x: { args: [] } } }, "mcpServers.x has neither"],
    ["an unknown type", { mcpServers: { x: { type: "ws", url: "ws://h" } } }, 'type "ws"'],
    [
      "a VS Code input",
      { servers: { x: { command: "n", args: ["${input:key}"] } } },
      "${input:key}",
    ],
    ["an unknown key", { mcpServers: { x: { command: "n", colour: 1 } } }, "colour"],
    ["an unset secret", { mcpServers: { x: { command: "n", env: { A: "${env:NOPE}" } } } }, "NOPE"],
  ])("refuses %s, naming the file and the entry", async (_what, json, problem) => {
    const error = await load(json).catch((err: unknown) => err);
    expect(error).toBeInstanceOf(McpConfigError);
    expect((error as Error).message).toContain("clients.json");
    expect((error as Error).message).toContain(problem);
  });
});

describe("paths", () => {
  it("runs a stdio server in its file's folder and resolves a relative command there", async () => {
    const dir = await serverDir({
      "a.yaml": "name: a\ntransport: stdio\ncommand: ./bin/server\n",
      "b.yaml": "name: b\ntransport: stdio\ncommand: node\ncwd: sub\nargs: [x.js]\n",
    });
    const [a, b] = (await loadMcpServers(dir, { env: {} })).map((s) => s.config);
    expect(a).toMatchObject({ command: join(dir, "bin", "server"), cwd: dir });
    expect(b).toMatchObject({ command: "node", cwd: join(dir, "sub"), args: ["x.js"] });
  });

  it("lets the shipped example find its server from any working directory", async () => {
    const [everything] = await loadMcpServers(join(ROOT, "examples", "mcp"), { env: {} });
    const config = everything?.config;
    if (config?.transport !== "stdio") throw new Error("expected stdio");
    expect(existsSync(resolve(config.cwd ?? "/", config.args[0] as string))).toBe(true);
  });
});

describe("loadMcpServers", () => {
  it("loads every YAML file of a folder in name order", async () => {
    const dir = await serverDir({
      "b.yaml": STDIO.replace("local", "second"),
      "a.yml": STDIO.replace("local", "first"),
      "notes.txt": "not a server",
    });
    const servers = await loadMcpServers(dir, { env: {} });
    expect(servers.map((s) => s.config.name)).toEqual(["first", "second"]);
    expect(servers[0]?.file).toBe(join(dir, "a.yml"));
  });

  it("refuses two files with the same server name, naming both", async () => {
    const dir = await serverDir({ "a.yaml": STDIO, "b.yaml": STDIO });
    await expect(loadMcpServers(dir, { env: {} })).rejects.toThrow(
      `${join(dir, "b.yaml")}: server name "local" is already used by ${join(dir, "a.yaml")}`,
    );
  });

  it("refuses a secret variable that is not set, naming it but no value", async () => {
    const dir = await serverDir({
      "r.yaml":
        "name: r\ntransport: http\nurl: http://h/mcp\nauth: { type: api_key, env: R_KEY }\n",
    });
    await expect(loadMcpServers(dir, { env: {} })).rejects.toThrow(
      /r\.yaml: environment variable R_KEY \(a secret of server "r"\) is not set/,
    );
    await expect(loadMcpServers(dir, { env: { R_KEY: "s3cret" } })).resolves.toHaveLength(1);
  });

  it("treats a missing default folder as no servers and a missing chosen folder as an error", async () => {
    const missing = join(tmpdir(), "toolmesh-no-such-mcp-dir");
    await expect(loadMcpServers(missing, { env: {} })).rejects.toThrow(
      /cannot read MCP server folder/,
    );
    await expect(loadMcpServers(missing, { env: {}, optional: true })).resolves.toEqual([]);
    expect(Defaults.mcpDir).toBe("tools/mcp");
  });
});

describe("secrets", () => {
  it("sends an API key as it is, in X-API-Key unless another header is named", async () => {
    const config = remote(
      parseServerFile(
        "name: r\ntransport: http\nurl: http://h/mcp\nheaders: { X-Client: tm }\nauth: { type: api_key, env: K }\n",
        "r.yaml",
      ),
    );
    expect(await remoteHeaders(config, { K: "k-1" })).toEqual({
      "X-Client": "tm",
      "X-API-Key": "k-1",
    });
    const custom = remote(
      parseServerFile(
        "name: r\ntransport: sse\nurl: http://h/sse\nauth: { type: api_key, header: X-Token, env: K }\n",
        "r.yaml",
      ),
    );
    expect(await remoteHeaders(custom, { K: "k-2" })).toEqual({ "X-Token": "k-2" });
  });

  it("sends a bearer token read from a mounted file, without its trailing newline", async () => {
    const dir = await serverDir({ token: "t-0k3n\n" });
    const config = remote(
      parseServerFile(
        `name: r\ntransport: http\nurl: http://h/mcp\nauth: { type: bearer, file: ${join(dir, "token")} }\n`,
        "r.yaml",
      ),
    );
    expect(await remoteHeaders(config, {})).toEqual({ Authorization: "Bearer t-0k3n" });
  });

  it("reads stdio env values from variables and files", async () => {
    const dir = await serverDir({ key: "from-file\r\n" });
    const config = parseServerFile(
      `${STDIO}env: { PLAIN: p, FROM_ENV: { env: SRC }, FROM_FILE: { file: ${join(dir, "key")} } }\n`,
      "s.yaml",
    );
    if (config.transport !== "stdio") throw new Error("expected stdio");
    expect(await stdioEnv(config, { SRC: "from-env" })).toEqual({
      PLAIN: "p",
      FROM_ENV: "from-env",
      FROM_FILE: "from-file",
    });
  });

  it("reads stdio args from variables and files, also inside a string", async () => {
    const dir = await serverDir({ pw: "s3cret\n" });
    const config = parseServerFile(
      `${STDIO.replace("args: [server.js]", "")}args:\n  - server.js\n  - { env: TOKEN }\n  - "postgresql://app:\${file:${join(dir, "pw")}}@db/app"\n  - "\${env:TOKEN}-\${HOME}"\n`,
      "s.yaml",
    );
    if (config.transport !== "stdio") throw new Error("expected stdio");
    expect(await stdioArgs(config, { TOKEN: "t" })).toEqual([
      "server.js",
      "t",
      "postgresql://app:s3cret@db/app",
      "t-${HOME}",
    ]);
  });

  it("names the variable or file in errors, never a value", async () => {
    await expect(readSecret({ env: "NOPE" }, {})).rejects.toThrow(
      "environment variable NOPE is not set",
    );
    await expect(readSecret({ file: "/no/such/secret" }, {})).rejects.toThrow(
      "cannot read secret file /no/such/secret: ENOENT",
    );
  });
});
