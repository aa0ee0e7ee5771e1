// A deadline kept through a resolver restart: the resolver that ran a hanging call is
// SIGKILLed with the call's executor, calls pile up in CALLS while none runs, and a new resolver takes that backlog
// (whose timestamps are all old) before the hanging call's deadline. The call must still end
// with deadline_exceeded stored at most 1 s after its deadline (docs/protocol.md, Deadlines).
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { setTimeout as sleep } from "node:timers/promises";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { ToolmeshClient } from "@toolmesh/client";
import { createSubjects } from "@toolmesh/protocol";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { fixtureTools, killAllServices, startService, toolAvailable } from "./helpers/mesh.js";

const HANGING_TIMEOUT_MS = 20_000;
const MAX_LATENESS_MS = 1_000;

let server: NatsServerHandle;
let nc: NatsConnection;
let client: ToolmeshClient;
let env: Record<string, string>;
const subjects = createSubjects();

beforeAll(async () => {
  server = await startNatsServer();
  env = { NATS_URL: server.url, TOOLMESH_TOOLS_DIR: fixtureTools("tools-bad") };
  nc = await connect({ servers: server.url });
  // A long grace: the answer must come from the mesh, never from the client's own timer.
  client = new ToolmeshClient(nc, { defaultTimeoutMs: 30_000, deadlineGraceMs: 30_000 });
});

afterAll(async () => {
  await nc?.close();
  await killAllServices();
  await server?.stop();
});

describe("deadlines through a resolver restart", () => {
  it("ends a hanging call at most 1 s after its deadline although the new resolver read a backlog first", async () => {
    const first = await startService("resolver", env);
    const executor = await startService("executor", env);
    await toolAvailable(first, "slow");
    const session = client.session("s-restart");
    const started = new Promise<void>((resolve) => {
      const stop = session.onEvent((e) => {
        if (e.type === "progress" && e.event.tool_call_id === "hang") {
          stop();
          resolve();
        }
      });
    });
    const hanging = session.submit(
      { id: "hang", name: "slow", arguments: { ms: 120_000, storage: {} } },
      { timeoutMs: HANGING_TIMEOUT_MS },
    );
    await started;
    // With its executor gone too, only a deadline keeper can end the call.
    await Promise.all([first.kill(), executor.kill()]);

    // Calls submitted while no resolver runs wait in CALLS: their timestamps are seconds old
    // when the next resolver takes them.
    for (let i = 0; i < 80; i++) {
      void session.submit({ id: `b${i}`, name: "slow", arguments: { ms: 1, storage: {} } });
      await sleep(20);
    }
    await sleep(1_500);
    const second = await startService("resolver", env);
    await toolAvailable(second, "slow");
    const readyAt = Date.now();

    const message = await hanging.result;
    expect(message.error?.code).toBe("deadline_exceeded");
    const deadlineAt = message.error?.details?.deadline_at as number;
    // The premise: a resolver ran again well before the deadline (same host, same clock).
    expect(deadlineAt - readyAt).toBeGreaterThan(1_000);
    const jsm = await jetstreamManager(nc);
    const stored = await jsm.streams.getMessage(subjects.streams.sessions, {
      last_by_subj: subjects.result(session.address, "hang"),
    });
    const lateness = (stored?.time.getTime() ?? Number.NaN) - deadlineAt;
    session.close();
    expect(lateness).toBeGreaterThanOrEqual(0);
    expect(lateness).toBeLessThanOrEqual(MAX_LATENESS_MS);
  });
});
