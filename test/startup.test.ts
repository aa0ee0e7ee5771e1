import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startNatsServer, stopAll } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { fixtureTools, killAllServices, startService } from "./helpers/mesh.js";
import { runCli } from "./helpers/cli.js";
import { freePort } from "@toolmesh/nats-launcher";

let server: NatsServerHandle;

beforeAll(async () => {
  server = await startNatsServer();
  await server.kill(); // its port now refuses connections; restart() brings it back there
});

afterAll(async () => {
  await killAllServices();
  await server?.stop();
  await stopAll();
});

const status = async (port: number, path: string): Promise<number> =>
  (await fetch(`http://127.0.0.1:${port}${path}`)).status;

describe("a service started while NATS is unreachable", () => {
  it("keeps trying, alive but not ready, and starts once NATS is there", async () => {
    const port = await freePort();
    const starting = startService("resolver", {
      NATS_URL: server.url,
      TOOLMESH_HEALTH_PORT: String(port),
      TOOLMESH_TOOLS_DIR: fixtureTools("tools-rel"),
    });
    await expect.poll(() => status(port, "/healthz").catch(() => 0), { timeout: 10_000 }).toBe(200);
    expect(await status(port, "/readyz")).toBe(503);
    await server.restart();
    const resolver = await starting;
    expect(await status(port, "/readyz")).toBe(200);
    const attempts = resolver.lines.filter((l) =>
      l.msg?.toString().startsWith("cannot reach NATS"),
    );
    expect(attempts.length).toBeGreaterThan(0);
    expect(attempts[0]).toMatchObject({ attempt: 1, servers: server.url });
    expect(await resolver.stop()).toBe(0);
    await server.kill();
  });

  it("exits with one line saying what to do once its start-up budget is spent", async () => {
    const failed = startService("executor", {
      NATS_URL: server.url,
      TOOLMESH_STARTUP_TIMEOUT_MS: "1500",
      TOOLMESH_TOOLS_DIR: fixtureTools("tools-rel"),
    });
    const error = await failed.then(
      () => undefined,
      (err: unknown) => err as Error,
    );
    expect(error?.message).toMatch(/exited with 1/);
    const stderr = error?.message.split("\n").slice(1).join("\n").trim();
    expect(stderr).toMatch(
      new RegExp(
        `^toolmesh executor: cannot reach NATS at ${server.url} within 1500 ms \\(.+\\): ` +
          "check NATS_URL and that nats-server runs, or raise TOOLMESH_STARTUP_TIMEOUT_MS$",
      ),
    );
  });

  it("`toolmesh serve` waits and gives up the same way, in one line, exit 2", async () => {
    const result = await runCli(["serve", "resolver", "--server", server.url], {
      TOOLMESH_STARTUP_TIMEOUT_MS: "1000",
      TOOLMESH_LOG_LEVEL: "warn",
    });
    expect(result.code).toBe(2);
    expect(result.stderr.trim().split("\n")).toHaveLength(1);
    expect(result.stderr).toMatch(
      /^toolmesh: cannot reach NATS at .* raise TOOLMESH_STARTUP_TIMEOUT_MS$/m,
    );
    expect(result.stdout).toMatch(/cannot reach NATS/);
  });
});
