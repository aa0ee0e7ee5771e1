import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { ToolmeshClient } from "@toolmesh/client";
import { Defaults, ErrorCode } from "@toolmesh/protocol";
import { eventually } from "./helpers/eventually.js";
import {
  fixtureTools,
  killAllServices,
  startService,
  toolAvailable,
  toolKnown,
} from "./helpers/mesh.js";
import type { ServiceProcess } from "./helpers/mesh.js";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";

// toolAvailable speaks for every resolver of the mesh, not for the one that answered first:
// a call may be taken by any of them.

let server: NatsServerHandle;
let nc: NatsConnection;
let env: Record<string, string>;
let frozen: ServiceProcess | undefined;

/** What one dry run of whoami says: found, not found, or no answer (`unavailable`). */
async function probe(client: ToolmeshClient): Promise<"found" | "unknown" | "no answer"> {
  const reply = await client.resolve("probe", { name: "whoami", arguments: {} });
  if (reply.ok) return "found";
  if (reply.error.code === ErrorCode.Unavailable) return "no answer";
  return reply.error.code === ErrorCode.UnknownTool ? "unknown" : "found";
}

beforeAll(async () => {
  server = await startNatsServer();
  env = { NATS_URL: server.url, TOOLMESH_TOOLS_DIR: fixtureTools("tools-a") };
  nc = await connect({ servers: server.url, noAsyncTraces: true });
}, 60_000);

afterAll(async () => {
  if (frozen !== undefined) process.kill(frozen.pid, "SIGCONT");
  await killAllServices();
  await nc?.close();
  await server?.stop();
});

describe("toolAvailable with several resolvers", () => {
  it("waits while one of two resolvers cannot find the tool, and resolves once both do", async () => {
    const [first, second] = await Promise.all([
      startService("resolver", env, 60_000),
      startService("resolver", env, 60_000),
    ]);
    if (first === undefined || second === undefined) throw new Error("two resolvers expected");
    // Short requests: a dry run the stopped resolver takes fails fast.
    const client = new ToolmeshClient(nc, { requestTimeoutMs: 1_000 });
    await toolKnown(client, "whoami", false);

    // The second resolver is stopped before the tool is registered: it cannot know it yet.
    process.kill(second.pid, "SIGSTOP");
    frozen = second;
    let thawed = false;
    let settledWhileStopped = false;
    const available = toolAvailable(first, "whoami").then(() => {
      if (!thawed) settledWhileStopped = true;
    });
    await startService("executor", env, 60_000);

    // Only the first resolver answers now, and it finds the tool: one dry run says so.
    const knownSince = await eventually("the first resolver to find whoami", async () =>
      (await probe(client)) === "found" ? Date.now() : undefined,
    );
    // Long enough for a helper that believed one answer to have had several (each dry run the
    // stopped resolver takes waits out the helper's request timeout).
    await eventually(
      "the first resolver to keep answering for a while",
      async () => {
        expect(await probe(client)).not.toBe("unknown");
        return Date.now() - knownSince > 2 * Defaults.requestTimeoutMs ? true : undefined;
      },
      { timeoutMs: 60_000 },
    );
    expect(settledWhileStopped).toBe(false);

    thawed = true;
    process.kill(second.pid, "SIGCONT");
    frozen = undefined;
    await available;
    expect(settledWhileStopped).toBe(false);
    // Both resolvers find it now: every dry run in a row does.
    for (let i = 0; i < 10; i++) expect(await probe(client)).toBe("found");
  }, 120_000);
});
