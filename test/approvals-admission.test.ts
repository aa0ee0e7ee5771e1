import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { ToolmeshClient } from "@toolmesh/client";
import type { ApprovalEntry } from "@toolmesh/protocol";
import { createSubjects } from "@toolmesh/protocol";
import { PolicyStore, openPolicyBucket } from "@toolmesh/policy";
import { gatewayAgents, gatewayTools, tallies } from "./helpers/gateway.js";
import { killAllServices, startService, toolAvailable } from "./helpers/mesh.js";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { runCli } from "./helpers/cli.js";
import { eventually } from "./helpers/eventually.js";

// What a call waiting for approval holds (ADR 0059): no session slot while it waits, and once
// approved it passes admission (it is not counted or refused again). One call in flight per
// session: a waiting call leaves the slot to another call, and is approved and runs while that
// call holds the slot — where a new call of the session is refused.

const POLICY = `@id("all")
permit (principal, action, resource);

@id("operator-decides")
@approval("operator")
permit (principal, action == Toolmesh::Action::"call", resource == Toolmesh::Tool::"tally")
when { context.args has ms && context.args.ms == 2 };
`;

let server: NatsServerHandle;
let nc: NatsConnection;
let tools: string;
let env: Record<string, string>;

beforeAll(async () => {
  server = await startNatsServer();
  let configs: string;
  [tools, configs] = await Promise.all([gatewayTools(), gatewayAgents()]);
  env = {
    NATS_URL: server.url,
    TOOLMESH_TOOLS_DIR: tools,
    TOOLMESH_CONFIG_DIR: configs,
    TOOLMESH_TOOLKIT_CONTEXT: JSON.stringify({ ledgerDir: tools }),
    TOOLMESH_SESSION_MAX_IN_FLIGHT: "1",
  };
  const [resolver] = await Promise.all([
    startService("resolver", env, 60_000),
    startService("executor", env, 60_000),
  ]);
  await toolAvailable(resolver, "tally");
  nc = await connect({ servers: server.url });
  const store = new PolicyStore(await openPolicyBucket(nc, { subjects: createSubjects() }));
  const { revision } = await store.set(POLICY);
  await resolver.waitForLog(
    (l) => l.msg === "policy set applied" && l.key === "operator" && l.revision === revision,
  );
}, 120_000);

afterAll(async () => {
  await nc?.close();
  await killAllServices();
  await server?.stop();
});

/** How often `tally` ran for call `id` of the session (keyed by tenant, session and key). */
async function ran(id: string): Promise<number> {
  return (await tallies(tools)).get(`acme/one-slot/one-slot/${id}`) ?? 0;
}

async function waiting(): Promise<ApprovalEntry[]> {
  const out = await runCli(["--tenant", "acme", "approvals", "list", "--json"], env);
  expect(out.code).toBe(0);
  return JSON.parse(out.stdout) as ApprovalEntry[];
}

describe("a call waiting for approval", () => {
  it("holds no session slot while it waits, and passes admission once approved", async () => {
    const session = new ToolmeshClient(nc, { tenant: "acme" }).session("one-slot");
    try {
      const held = session.submit({ id: "held-1", name: "tally", arguments: { ms: 2 } });
      await eventually("held-1 waits", async () =>
        (await waiting()).find((e) => e.call_id === "held-1"),
      );
      // The waiting call leaves the session's one slot free: another call runs meanwhile.
      const quick = await session.submit({ id: "quick-1", name: "tally", arguments: { ms: 0 } })
        .result;
      expect(quick.error).toBeUndefined();
      // A long call takes the slot; a new call of the session is refused ...
      const long = session.submit({ id: "long-1", name: "tally", arguments: { ms: 12_000 } });
      await eventually("long-1 runs", async () => ((await ran("long-1")) === 1 ? true : undefined));
      const refused = await session.submit({ id: "over-1", name: "tally", arguments: { ms: 0 } })
        .result;
      expect(refused.error?.code).toBe("overloaded");
      let longEnded = false;
      void long.result.then(() => (longEnded = true));
      // ... but the approved call runs at once: it was not admitted again.
      expect((await runCli(["--tenant", "acme", "approvals", "approve", "held-1"], env)).code).toBe(
        0,
      );
      const approved = await held.result;
      expect(approved.error).toBeUndefined();
      expect(await ran("held-1")).toBe(1);
      expect(await ran("over-1")).toBe(0);
      // It ended while the long call still held the slot.
      expect(longEnded).toBe(false);
      expect((await long.result).error).toBeUndefined();
    } finally {
      session.close();
    }
  });
});
