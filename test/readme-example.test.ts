import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { killAllServices, startService, toolAvailable } from "./helpers/mesh.js";

// The README's client example is examples/client/main.ts, compiled with the workspace and run
// here against a real mesh, so the README cannot drift from the library.
const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
const run = promisify(execFile);
let server: NatsServerHandle;

beforeAll(async () => {
  server = await startNatsServer();
  const env = {
    NATS_URL: server.url,
    TOOLMESH_TOOLS_DIR: join(ROOT, "tools", "builtin"),
    TOOLMESH_TENANT: "acme",
  };
  const resolver = await startService("resolver", env);
  await startService("executor", env);
  await toolAvailable(resolver, "optimize_structure", "get_weather");
});

afterAll(async () => {
  await killAllServices();
  await server?.stop();
});

describe("the README's client example", () => {
  it("is in the README word for word", () => {
    const readme = readFileSync(join(ROOT, "README.md"), "utf8");
    const example = readFileSync(join(ROOT, "examples", "client", "main.ts"), "utf8");
    expect(readme).toContain("```ts\n" + example + "```");
  });

  it("runs against a mesh and prints what it promises", async () => {
    const { stdout } = await run(
      process.execPath,
      [join(ROOT, "examples", "client", "dist", "main.js")],
      {
        env: { PATH: process.env.PATH ?? "", NATS_URL: server.url },
        timeout: 60_000,
      },
    );
    const lines = stdout.trim().split("\n");
    expect(JSON.parse(lines.find((l) => l.startsWith("{")) ?? "{}")).toMatchObject({
      structure: "Cu.cif",
      head: "Omat24",
    });
    expect(lines).toContain("call_1 a");
    expect(lines).toContain("call_2 missing_arguments");
    expect(
      lines.some((l) =>
        /^(true cancelled cancelled|false pending cancelled|false done finished first)$/.test(l),
      ),
    ).toBe(true);
    expect(lines).toContain("{ text: 'hi', upper: false }");
  });
});
