import { copyFile, mkdir, mkdtemp, readFile, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { keyDigest } from "@toolmesh/gateway";
import { startService } from "./mesh.js";
import type { ServiceProcess } from "./mesh.js";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..", "..");

/** A folder of builtin tools for gateway tests: echo, optimize_structure, slow, ledger, strict, tally. */
export async function gatewayTools(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "toolmesh-gateway-tools-"));
  await Promise.all([
    copyFile(join(ROOT, "tools", "builtin", "echo.js"), join(dir, "echo.js")),
    copyFile(
      join(ROOT, "tools", "builtin", "optimize-structure.js"),
      join(dir, "optimize-structure.js"),
    ),
    copyFile(join(ROOT, "test", "fixtures", "tools-bad", "slow.js"), join(dir, "slow.js")),
    copyFile(join(ROOT, "test", "fixtures", "tools-bad", "ledger.js"), join(dir, "ledger.js")),
    copyFile(join(ROOT, "test", "fixtures", "tools-bad", "strict.js"), join(dir, "strict.js")),
    writeFile(join(dir, "tally.js"), TALLY),
  ]);
  return dir;
}

// Records each execution by idempotency key (under the toolkit context's ledgerDir), then waits
// `ms` honouring its abort signal: tests see how often a long call really started.
const TALLY = `import { appendFileSync, readFileSync } from "node:fs";
import { join } from "node:path";
export default {
  name: "tally",
  description: "Counts its executions per idempotency key, then waits ms.",
  parameters: { type: "object", properties: { ms: { type: "integer", minimum: 0 } } },
  async handler(args, ctx) {
    const file = join(String(ctx.context.ledgerDir), "tally.log");
    appendFileSync(file, JSON.stringify(ctx.idempotencyKey) + "\\n");
    await new Promise((resolve, reject) => {
      const timer = setTimeout(resolve, args.ms ?? 0);
      ctx.signal.addEventListener("abort", () => { clearTimeout(timer); reject(ctx.signal.reason); });
    });
    const count = readFileSync(file, "utf8").split("\\n")
      .filter((line) => line === JSON.stringify(ctx.idempotencyKey)).length;
    return { key: ctx.idempotencyKey, count };
  },
};
`;

/** How often `tally` started for each idempotency key. */
export async function tallies(toolsDir: string): Promise<Map<string, number>> {
  const text = await readFile(join(toolsDir, "tally.log"), "utf8").catch(() => "");
  const counts = new Map<string, number>();
  for (const line of text.split("\n").filter((l) => l !== "")) {
    const key = JSON.parse(line) as string;
    counts.set(key, (counts.get(key) ?? 0) + 1);
  }
  return counts;
}

/** Agents `writer` (echo, slow, ledger, strict, tally) and `chemist` (optimize_structure). */
export async function gatewayAgents(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "toolmesh-gateway-configs-"));
  await mkdir(join(dir, "agents"));
  await mkdir(join(dir, "tool_sets"));
  await writeFile(
    join(dir, "agents", "writer.yaml"),
    "name: writer\ntools: [echo, slow, ledger, strict, tally]\n",
  );
  await writeFile(
    join(dir, "agents", "chemist.yaml"),
    "name: chemist\ntools: [optimize_structure]\n",
  );
  return dir;
}

/** The keys of the gateway tests, and the file that lists them. */
export const KEYS = {
  /** Tenant acme, any agent. */
  acme: "key-acme-all-0123456789",
  /** Tenant acme, agent writer only. */
  acmeWriter: "key-acme-writer-0123456789",
  /** Tenant globex, agent chemist only. */
  globex: "key-globex-chemist-0123456789",
} as const;

/** Writes a keys file (YAML) for {@link KEYS}; `acme` comes from the variable `ACME_KEY`. */
export async function writeKeysFile(): Promise<{ file: string; env: Record<string, string> }> {
  const dir = await mkdtemp(join(tmpdir(), "toolmesh-gateway-keys-"));
  const file = join(dir, "keys.yaml");
  await writeFile(
    file,
    [
      "keys:",
      "  - env: ACME_KEY",
      "    tenant: acme",
      `  - sha256: ${keyDigest(KEYS.acmeWriter)}`,
      "    tenant: acme",
      "    agents: [writer]",
      `  - sha256: ${keyDigest(KEYS.globex)}`,
      "    tenant: globex",
      "    agents: [chemist]",
      "",
    ].join("\n"),
  );
  return { file, env: { ACME_KEY: KEYS.acme } };
}

/** Starts a gateway process on a free port; resolves with it and its `/mcp` URL. */
export async function startGateway(
  env: Record<string, string>,
): Promise<{ process: ServiceProcess; url: string; port: number }> {
  const process = await startService("gateway", { TOOLMESH_GATEWAY_PORT: "0", ...env }, 60_000);
  const line = await process.waitForLog((l) => l.msg === "gateway started");
  const port = line.port as number;
  return { process, url: `http://127.0.0.1:${port}/mcp`, port };
}

/**
 * An MCP client of the TypeScript SDK (v2) connected to `url` with a bearer key: a 2025-era
 * session by default, or pinned to MCP 2026-07-28.
 */
export async function mcpClient(
  url: string,
  key: string | undefined,
  headers: Record<string, string> = {},
  era: "legacy" | "2026-07-28" = "legacy",
): Promise<Client> {
  const client = new Client(
    { name: "gateway-test", version: "1.0.0" },
    { versionNegotiation: { mode: era === "legacy" ? "legacy" : { pin: era } } },
  );
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: {
      headers: { ...(key === undefined ? {} : { authorization: `Bearer ${key}` }), ...headers },
    },
  });
  await client.connect(transport);
  return client;
}

/**
 * One MCP 2026-07-28 request on the wire, without an SDK: the envelope in `_meta` (protocol
 * version, client info, `capabilities`), the `Mcp-Method` header and `Mcp-Name` for a request
 * naming a tool or task, with a bearer `key`. Answers the HTTP response.
 */
export function modernPost(
  url: string,
  key: string,
  method: string,
  params: Record<string, unknown>,
  capabilities: Record<string, unknown> = {},
): Promise<Response> {
  const named = params.name ?? params.taskId;
  return fetch(url, {
    method: "POST",
    headers: {
      authorization: `Bearer ${key}`,
      accept: "application/json, text/event-stream",
      "content-type": "application/json",
      "mcp-protocol-version": "2026-07-28",
      "mcp-method": method,
      ...(typeof named === "string" ? { "mcp-name": named } : {}),
    },
    body: JSON.stringify({
      jsonrpc: "2.0",
      id: 1,
      method,
      params: {
        ...params,
        _meta: {
          "io.modelcontextprotocol/protocolVersion": "2026-07-28",
          "io.modelcontextprotocol/clientInfo": { name: "raw", version: "1" },
          "io.modelcontextprotocol/clientCapabilities": capabilities,
        },
      },
    }),
  });
}
