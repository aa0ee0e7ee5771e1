import { spawn } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { once } from "node:events";
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { createInterface } from "node:readline";

/** `test/fixtures/mcp/test-server.mjs` over HTTP or SSE, its own process. */
export interface TestMcpServer {
  url: string;
  child: ChildProcess;
}

const TEST_SERVER = join(import.meta.dirname, "..", "fixtures", "mcp", "test-server.mjs");

/** Starts the test MCP server in `mode` on `port` (0: any), with `env` added to PATH alone. */
export async function startTestMcpServer(
  mode: "--http" | "--sse",
  env: Record<string, string>,
  port = 0,
): Promise<TestMcpServer> {
  const child = spawn(process.execPath, [TEST_SERVER, mode, "--port", String(port)], {
    cwd: join(import.meta.dirname, "..", ".."),
    env: { PATH: process.env.PATH ?? "", ...env },
    stdio: ["ignore", "pipe", "inherit"],
  });
  const lines = createInterface({ input: child.stdout });
  const [line] = (await once(lines, "line")) as [string];
  lines.close();
  return { url: (JSON.parse(line) as { listening: string }).listening, child };
}

/**
 * Writes the bridge's server file `{name}.yaml` in `dir`: the test MCP server over stdio, as
 * server `name`, with `env` for it.
 */
export async function writeStdioTestServer(
  dir: string,
  name: string,
  env?: Record<string, string>,
): Promise<void> {
  const file = {
    name,
    transport: "stdio",
    command: process.execPath,
    args: [TEST_SERVER],
    ...(env === undefined ? {} : { env }),
  };
  await writeFile(join(dir, `${name}.yaml`), JSON.stringify(file));
}
