/**
 * A NATS server SIGKILLed under load and restarted on the same store: acknowledged work-queue
 * messages it brings back (orphans) are removed by the resolvers' reconciliation, so once every
 * call has ended the work and call queues are empty — and every call ended exactly once.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { ToolmeshClient } from "@toolmesh/client";
import type { CallHandle } from "@toolmesh/client";
import { createSubjects } from "@toolmesh/protocol";
import type { ToolMessage } from "@toolmesh/protocol";
import { startNatsServer, stopAll } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { fixtureTools, killAllServices, startService, toolAvailable } from "./helpers/mesh.js";
import type { ServiceProcess } from "./helpers/mesh.js";

const CALLS = 1_200;
/** The server is killed once this many calls have ended. */
const KILL_AFTER = 500;
const IN_FLIGHT = 64;
const TOOL = "ledger_append";

let server: NatsServerHandle;
let nc: NatsConnection;
let workDir: string;
let execDir: string;
const services: ServiceProcess[] = [];

beforeAll(async () => {
  server = await startNatsServer();
  workDir = mkdtempSync(join(tmpdir(), "toolmesh-orphans-"));
  execDir = join(workDir, "exec");
  mkdirSync(join(workDir, "ledger"));
  mkdirSync(execDir);
  const env = {
    NATS_URL: server.url,
    TOOLMESH_TOOLS_DIR: fixtureTools("tools-fault"),
    TOOLMESH_TOOLKIT_CONTEXT: JSON.stringify({ ledgerDir: join(workDir, "ledger"), execDir }),
    TOOLMESH_ACK_WAIT_MS: "2000",
  };
  const resolver = await startService("resolver", env);
  services.push(resolver, await startService("executor", env));
  await toolAvailable(resolver, TOOL);
  nc = await connect({ servers: server.url, maxReconnectAttempts: -1, reconnectTimeWait: 100 });
}, 60_000);

afterAll(async () => {
  await nc?.close().catch(() => undefined);
  await killAllServices();
  await server?.stop();
  await stopAll();
  if (workDir !== undefined) rmSync(workDir, { recursive: true, force: true });
});

describe("a NATS server killed under load", () => {
  it("leaves no acknowledged message behind in the work and call queues", async () => {
    const subjects = createSubjects();
    const client = new ToolmeshClient(nc);
    const session = client.session("orphans");
    const finals = new Map<string, ToolMessage[]>();
    session.onEvent((e) => {
      if (e.type === "result")
        finals.set(e.message.tool_call_id, [
          ...(finals.get(e.message.tool_call_id) ?? []),
          e.message,
        ]);
    });
    const handles: CallHandle[] = [];
    let ended = 0;
    let killed: Promise<void> | undefined;
    // At most IN_FLIGHT calls at once, new ones as others end: the server is busy when killed.
    let next = 0;
    const submitNext = (): void => {
      if (next >= CALLS) return;
      const id = `k${String(next++).padStart(5, "0")}`;
      const handle = session.submit(
        { id, name: TOOL, arguments: { work_ms: 2 } },
        { timeoutMs: 10_000 },
      );
      handles.push(handle);
      void handle.result.then(() => {
        ended++;
        if (ended === KILL_AFTER)
          killed = server.kill().then(async () => {
            await server.restart();
          });
        submitNext();
      });
    };
    for (let i = 0; i < IN_FLIGHT; i++) submitNext();
    await expect.poll(() => handles.length, { timeout: 60_000 }).toBe(CALLS);
    const results = await Promise.all(handles.map((h) => h.result));
    await killed;
    session.close();

    expect(results.filter((m) => m.error !== undefined).map((m) => m.error?.code)).toEqual([]);
    // Exactly one final message per call: repeats (a redelivery answered from the stored
    // result) must be copies of it.
    const distinct = [...finals.entries()].filter(
      ([, list]) => new Set(list.map((m) => m.content)).size !== 1,
    );
    expect(distinct.map(([id]) => id)).toEqual([]);
    const reruns =
      readdirSync(execDir)
        .flatMap((f) => readFileSync(join(execDir, f), "utf8").split("\n"))
        .filter(Boolean).length - CALLS;
    expect(readdirSync(join(workDir, "ledger"))).toHaveLength(CALLS); // one side effect each

    // Once every call has ended, nothing of theirs may stay queued.
    const jsm = await jetstreamManager(nc);
    const queued = async (): Promise<Record<string, number>> => ({
      work: (await jsm.streams.info(subjects.streams.work)).state.messages,
      calls: (await jsm.streams.info(subjects.streams.calls)).state.messages,
    });
    await expect.poll(queued, { timeout: 25_000, interval: 250 }).toEqual({ work: 0, calls: 0 });
    const reconciled = services[0]?.lines.filter((l) => l.msg === "orphaned messages reconciled");
    console.log(
      `server killed after ${KILL_AFTER} of ${CALLS} calls: handler re-runs ${reruns}, ` +
        `reconciled ${JSON.stringify(reconciled?.map(({ found, deleted }) => ({ found, deleted })))}`,
    );
    expect(services.map((s) => s.child.exitCode)).toEqual([null, null]);
  }, 120_000);
});
