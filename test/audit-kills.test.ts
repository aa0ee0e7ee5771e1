import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { ToolmeshClient } from "@toolmesh/client";
import type { ToolMessage } from "@toolmesh/protocol";
import { createSubjects } from "@toolmesh/protocol";
import type { AuditRecord } from "@toolmesh/audit";
import { readTrail, verifyTrail } from "@toolmesh/audit";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import type { ServiceProcess } from "./helpers/mesh.js";
import { fixtureTools, killAllServices, startService, toolAvailable } from "./helpers/mesh.js";
import { runCli } from "./helpers/cli.js";
import { until } from "./helpers/eventually.js";

// The audit trail through executor, resolver and NATS kills (SIGKILL, mid-call): every call
// that ended has its admission and its end in the trail, each once, and the chain verifies.
// TOOLMESH_TEST_AUDIT_KILL_CALLS runs more calls (the kills scale with them).

const subjects = createSubjects();
const CALLS = Number(process.env.TOOLMESH_TEST_AUDIT_KILL_CALLS ?? 240);
let server: NatsServerHandle;
let nc: NatsConnection;
let env: Record<string, string>;

beforeAll(async () => {
  server = await startNatsServer();
  const ledgerDir = await mkdtemp(join(tmpdir(), "toolmesh-audit-kills-"));
  env = {
    NATS_URL: server.url,
    TOOLMESH_TOOLS_DIR: fixtureTools("tools-rel"),
    TOOLMESH_TOOLKIT_CONTEXT: JSON.stringify({ ledgerDir }),
    TOOLMESH_AUDIT: "required",
  };
  expect((await runCli(["setup", "--tenants", "default"], env)).code).toBe(0);
  nc = await connect({ servers: server.url });
}, 60_000);

afterAll(async () => {
  await nc?.close();
  await killAllServices();
  await server?.stop();
});

describe("the audit trail through executor, resolver and NATS kills", () => {
  it(
    "holds every ended call's admission and end, once each, and verifies",
    async () => {
      let resolver = await startService("resolver", env);
      const resolvers = [resolver];
      const executors: ServiceProcess[] = [
        await startService("executor", env),
        await startService("executor", env),
      ];
      await toolAvailable(resolver, "sleepy");
      const client = new ToolmeshClient(nc, { defaultTimeoutMs: 60_000 });
      const session = client.session("s-kills");
      const results: Promise<ToolMessage>[] = [];
      const ids: string[] = [];
      let kills = 0;
      for (let i = 0; i < CALLS; i++) {
        const handle = session.submit({ name: "sleepy", arguments: { ms: 20 + (i % 5) * 20 } });
        ids.push(handle.callId);
        results.push(handle.result);
        await new Promise((resolve) => setTimeout(resolve, 20));
        if (i % 40 === 39) {
          // One executor killed mid-call and replaced.
          await executors.shift()?.kill();
          kills++;
          executors.push(await startService("executor", env));
        }
        if (i % 240 === 120) {
          // The resolver too, while it admits calls.
          await resolver.kill();
          kills++;
          resolver = await startService("resolver", env);
          resolvers.push(resolver);
        }
        if (i % 240 === 200) {
          // And the server, while calls run and the trail is written: back on the same store.
          await server.kill();
          kills++;
          await server.restart();
        }
      }
      const answers = await Promise.all(results);
      const failed = answers.filter((m) => m.error !== undefined).map((m) => m.error?.code);
      const byCall = new Map<string, AuditRecord[]>();
      let events: AuditRecord[] = [];
      // The services write on their own time: read until every call's end (or its refusal) is in.
      await until(
        "every call's end or refusal in the trail",
        async () => {
          events = [];
          for await (const { record } of readTrail(nc, subjects, "default"))
            events.push(record as AuditRecord);
          byCall.clear();
          for (const e of events) {
            if (e.call_id === undefined) continue;
            byCall.set(e.call_id, [...(byCall.get(e.call_id) ?? []), e]);
          }
          return ids.every((id) =>
            byCall.get(id)?.some((e) => e.type === "call.ended" || e.type === "call.refused"),
          );
        },
        { timeoutMs: 30_000 },
      ).catch(() => undefined);
      const count = (id: string, type: string) =>
        (byCall.get(id) ?? []).filter((e) => e.type === type).length;
      // In `required` mode a call whose admission cannot be written (the server restarting under
      // it) is refused `unavailable` (docs/audit.md): its trail holds that refusal instead.
      const refusedUnrecorded = (id: string) =>
        (byCall.get(id) ?? []).some(
          (e) => e.type === "call.refused" && e.data.code === "unavailable",
        );
      const without = (type: string) => ids.filter((id) => count(id, type) === 0);
      const twice = (type: string) => ids.filter((id) => count(id, type) > 1);
      const summary = {
        kills,
        failed,
        firstFailure: answers.find((m) => m.error !== undefined)?.error?.message,
        refusedUnrecorded: ids.filter(refusedUnrecorded).length,
        events: events.length,
        noAdmission: without("call.admitted").filter((id) => !refusedUnrecorded(id)).length,
        noEnd: without("call.ended").length,
        admittedTwice: twice("call.admitted").length,
        endedTwice: twice("call.ended").length,
        startedWithoutEnd: ids.filter(
          (id) => count(id, "attempt.started") > count(id, "attempt.ended"),
        ).length,
        repeatedIds: events.length - new Set(events.map((e) => e.id)).size,
      };
      console.log("audit through kills", JSON.stringify({ calls: CALLS, ...summary }));
      if (failed.length > summary.refusedUnrecorded)
        // What the resolvers said of their trail writes: why calls were refused.
        console.log(
          "resolvers' audit warnings",
          JSON.stringify(
            resolvers.flatMap((r) =>
              r.lines
                .filter((l) => Number(l.level) >= 40 && /audit/.test(String(l.msg)))
                .map((l) => ({ pid: r.pid, time: l.time, msg: l.msg, err: l.err })),
            ),
          ),
        );
      // Every call that failed was such a refusal, and nothing else failed.
      expect(failed).toEqual(
        Array.from({ length: summary.refusedUnrecorded }, () => "unavailable"),
      );
      expect(summary).toMatchObject({
        noAdmission: 0,
        noEnd: 0,
        admittedTwice: 0,
        endedTwice: 0,
        repeatedIds: 0,
      });
      expect(await verifyTrail(nc, subjects, "default")).toEqual({
        ok: true,
        count: events.length,
      });
    },
    Math.max(240_000, CALLS * 200),
  );

  it("holds the end of a call whose executor is killed while no resolver runs", async () => {
    await killAllServices();
    const resolver = await startService("resolver", env);
    const executor = await startService("executor", env);
    await toolAvailable(resolver, "sleepy");
    const client = new ToolmeshClient(nc, { defaultTimeoutMs: 30_000 });
    const handle = client.session("s-outage").submit({ name: "sleepy", arguments: { ms: 1_500 } });
    const inTrail = (type: string) => async () => {
      for await (const { record } of readTrail(nc, subjects, "default")) {
        const e = record as AuditRecord;
        if (e.call_id === handle.callId && e.type === type) return true;
      }
      return false;
    };
    await until("the call's attempt started", inTrail("attempt.started"), { timeoutMs: 20_000 });
    // The call runs; the resolver goes (a restart that takes long), so the executor cannot hand
    // on the call's end. It is killed 6 s after the answer went out (longer than the executor
    // used to wait, on purpose): had it acknowledged the work by then, the record went with it.
    await resolver.kill();
    expect((await handle.result).error).toBeUndefined();
    await new Promise((resolve) => setTimeout(resolve, 6_000));
    await executor.kill();
    await startService("resolver", env);
    await startService("executor", env);
    await until("the call's end in the trail", inTrail("call.ended"), { timeoutMs: 20_000 });
    expect(await verifyTrail(nc, subjects, "default")).toMatchObject({ ok: true });
  }, 60_000);
});
