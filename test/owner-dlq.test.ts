import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { ToolmeshClient } from "@toolmesh/client";
import type { Session, SessionEvent } from "@toolmesh/client";
import type { DeadLetter, ReplayOutcome } from "@toolmesh/control-plane";
import { createSubjects } from "@toolmesh/protocol";
import type { ToolMessage } from "@toolmesh/protocol";
import { runCli } from "./helpers/cli.js";
import { killExecutors, spawnExecutor, superviseUntil } from "./helpers/crashing-executor.js";
import { fixtureTools, killAllServices, startService } from "./helpers/mesh.js";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { ownerAccountsConfig } from "./helpers/owner-accounts.js";
import { eventually } from "./helpers/eventually.js";

// Work of an owner's tool (ADR 0041) that kills its executor every time is dead-lettered from
// its owner's work stream like the mesh's (ADR 0009), and its replay goes back to that stream.
// The executor lives in the owner's account (ADR 0031); setup, the resolver (which creates the
// owner's stream and adds its advisories) and the CLI run as the users `toolmesh auth config`
// generates. Runs on whichever nats-server is first on the PATH (CI: 2.9.10 and the current).
const subjects = createSubjects({ prefix: "odlq" });

let server: NatsServerHandle;
let tmp: string;
let flagFile: string;
let mesh: NatsConnection;
let session: Session;
const events: SessionEvent[] = [];
/** The CLI as the generated `operator` user (`toolmesh auth config --owners acme`). */
let operatorEnv: Record<string, string>;
/** The owner's executor, in the owner's account. */
let ownerEnv: Record<string, string>;

beforeAll(async () => {
  server = await startNatsServer({
    config: ownerAccountsConfig(subjects, { acme: ["crasher", "echo"] }),
  });
  tmp = await mkdtemp(join(tmpdir(), "toolmesh-owner-dlq-"));
  flagFile = join(tmp, "healthy");
  const common = { NATS_URL: server.url, TOOLMESH_PREFIX: subjects.prefix };
  operatorEnv = { ...common, NATS_USER: "operator", NATS_PASSWORD: "operator" };
  ownerEnv = {
    ...common,
    NATS_USER: "executor-acme",
    NATS_PASSWORD: "executor-acme",
    TOOLMESH_OWNER: "acme",
    TOOLMESH_TOOLS_DIR: fixtureTools("tools-poison"),
    TOOLMESH_ACK_WAIT_MS: "1000",
    TOOLMESH_TOOLKIT_CONTEXT: JSON.stringify({ poison_flag: flagFile }),
  };
  const setup = await runCli(["setup"], { ...common, NATS_USER: "setup", NATS_PASSWORD: "setup" });
  expect(setup.code, setup.stderr).toBe(0);
  await startService("resolver", { ...common, NATS_USER: "resolver", NATS_PASSWORD: "resolver" });
  mesh = await connect({ servers: server.url, user: "mesh", pass: "mesh" });
  await spawnExecutor(ownerEnv).ready;
  const client = new ToolmeshClient(mesh, { prefix: subjects.prefix, defaultTimeoutMs: 30_000 });
  session = client.session("s-owner");
  session.onEvent((e) => events.push(e));
}, 60_000);

afterAll(async () => {
  session?.close();
  await killExecutors();
  await killAllServices();
  await mesh?.close();
  await server?.stop();
  if (tmp !== undefined) await rm(tmp, { recursive: true, force: true });
});

function resultsOf(callId: string): ToolMessage[] {
  return events.flatMap((e) =>
    e.type === "result" && e.message.tool_call_id === callId ? [e.message] : [],
  );
}

describe("an owner's crash-looping work", () => {
  it("is dead-lettered from the owner's stream, listed, and replayed onto it", async () => {
    const handle = session.submit({ id: "p1", name: "crasher", arguments: { note: "poison" } });
    const { deaths, survivor } = await superviseUntil(
      handle.result,
      spawnExecutor(ownerEnv),
      ownerEnv,
    );
    const message = await handle.result;

    // The mesh's crash-loop outcome (test/dlq.test.ts), not the deadline's.
    expect(deaths).toBeGreaterThanOrEqual(1);
    expect(message.error).toMatchObject({
      code: "tool_error",
      retryable: false,
      details: { dead_letter: true, reason: "max_deliveries", deliveries: 4 },
    });

    const ownerStream = subjects.workStream("acme");
    const list = await runCli(["dlq", "list", "--json"], operatorEnv);
    expect(list.code, list.stderr).toBe(0);
    const letters = JSON.parse(list.stdout) as DeadLetter[];
    expect(letters).toHaveLength(1);
    const letter = letters[0] as DeadLetter;
    expect(letter).toMatchObject({
      tool: "crasher",
      reason: "max_deliveries",
      deliveries: 4,
      stream: ownerStream,
      subject: subjects.work("crasher", "acme"),
      call_id: "p1",
      session_id: "s-owner",
    });
    // Moved, not copied: the owner's stream no longer holds it.
    const jsm = await jetstreamManager(mesh);
    expect(await jsm.streams.getMessage(ownerStream, { seq: letter.original_seq ?? 0 })).toBe(null);

    // Fixed: the replay runs on the owner's stream, served by the owner's executor. The one
    // started after the last crash is ready first: the replay's deadline runs from its publish.
    await writeFile(flagFile, "fixed");
    await survivor.ready;
    const replay = await runCli(["dlq", "replay", String(letter.seq), "--json"], operatorEnv);
    expect(replay.code, replay.stderr).toBe(0);
    const outcome = JSON.parse(replay.stdout) as ReplayOutcome;
    expect(outcome).toMatchObject({
      status: "replayed",
      stream: ownerStream,
      subject: subjects.work("crasher", "acme"),
      deleted: true,
    });
    const healed = await eventually(
      "the replay's result",
      () => resultsOf("p1").find((m) => m.error === undefined),
      { timeoutMs: 30_000 },
    );
    expect(JSON.parse(healed.content)).toMatchObject({ healed: true, args: { note: "poison" } });
    expect(resultsOf("p1")).toHaveLength(2);
    // The executor acks once the mesh has answered its `finalize`, after the result went out.
    for (let i = 0; ; i++) {
      const left = await jsm.streams.getMessage(ownerStream, { seq: outcome.stream_seq ?? 0 });
      if (left === null) break;
      if (i === 50) throw new Error("the replayed work was never acknowledged");
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  });
});
