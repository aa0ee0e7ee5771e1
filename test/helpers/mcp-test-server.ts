import { spawn } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { once } from "node:events";
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
