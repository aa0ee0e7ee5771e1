import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { ToolmeshClient } from "@toolmesh/client";
import { createSubjects } from "@toolmesh/protocol";
import { ensureStream, tenantAuditStreamSpec } from "@toolmesh/nats";
import type { AuditRecord } from "@toolmesh/audit";
import { readTrail } from "@toolmesh/audit";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { fixtureTools, killAllServices, startService, toolAvailable } from "./helpers/mesh.js";

// A service that shuts down writes the audit events it still holds before it closes its
// connection: here the tenant's trail cannot be written while the call runs (its stream is not
// there yet), so every event of the call waits in the resolver's and the executor's queues, and
// the stream appears just as both are told to stop.

const subjects = createSubjects();
let server: NatsServerHandle;
let nc: NatsConnection;

beforeAll(async () => {
  server = await startNatsServer();
  nc = await connect({ servers: server.url });
}, 30_000);

afterAll(async () => {
  await nc?.close();
  await killAllServices();
  await server?.stop();
});

describe("a graceful shutdown", () => {
  it("writes the audit events its services still hold", async () => {
    const env = {
      NATS_URL: server.url,
      TOOLMESH_TOOLS_DIR: fixtureTools("tools-a"),
      TOOLMESH_AUDIT: "best-effort",
    };
    const resolver = await startService("resolver", env);
    const executor = await startService("executor", env);
    await toolAvailable(resolver, "inspect");
    const client = new ToolmeshClient(nc, { defaultTimeoutMs: 15_000 });
    const handle = client.session("s-stop").submit({ name: "inspect", arguments: { query: "q" } });
    expect((await handle.result).error).toBeUndefined();
    // Both keep retrying, further apart each time; the next try is seconds away when the trail
    // can be written and the services are stopped.
    await new Promise((resolve) => setTimeout(resolve, 2_000));
    await ensureStream(await jetstreamManager(nc), tenantAuditStreamSpec(subjects, "default"));
    expect(await Promise.all([resolver.stop(), executor.stop()])).toEqual([0, 0]);

    const types: string[] = [];
    for await (const { record } of readTrail(nc, subjects, "default")) {
      const event = record as AuditRecord;
      if (event.call_id === handle.callId) types.push(event.type);
    }
    // A brief attempt that ends its call is recorded by the call's end (ADR 0067).
    expect(types).toEqual(["call.admitted", "call.ended"]);
    for (const service of [resolver, executor])
      expect(service.lines.filter((l) => /they are lost/.test(String(l.msg)))).toEqual([]);
  }, 60_000);
});
