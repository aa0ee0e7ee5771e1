import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { NatsConnection } from "@nats-io/nats-core";
import { headers as createHeaders } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import type { JetStreamClient, JetStreamManager } from "@nats-io/jetstream";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { ToolmeshClient } from "@toolmesh/client";
import type { Session, SessionEvent } from "@toolmesh/client";
import { Header, callKey, createSubjects, decodeJson, encodeJson } from "@toolmesh/protocol";
import type { ToolMessage } from "@toolmesh/protocol";
import { deadlineHeaders, listDeadLetters } from "@toolmesh/control-plane";
import { ensureDurableConsumer } from "@toolmesh/nats";
import type { DeadLetter, DeadLetterDetail, ReplayOutcome } from "@toolmesh/control-plane";
import { resolvedCall } from "./helpers/calls.js";
import { killExecutors, spawnExecutor, superviseUntil } from "./helpers/crashing-executor.js";
import type { ExecutorProcess } from "./helpers/crashing-executor.js";
import { runCli } from "./helpers/cli.js";
import type { CliOutcome } from "./helpers/cli.js";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { fixtureTools, killAllServices, startService, toolAvailable } from "./helpers/mesh.js";
import type { ServiceProcess } from "./helpers/mesh.js";
import { eventually } from "./helpers/eventually.js";

const subjects = createSubjects();

let server: NatsServerHandle;
let tmp: string;
let flagFile: string;
let env: Record<string, string>;
let resolver: ServiceProcess;
let executor: ExecutorProcess;
let nc: NatsConnection;
let js: JetStreamClient;
let jsm: JetStreamManager;
let client: ToolmeshClient;
let session: Session;
const events: SessionEvent[] = [];
/** The crasher call's letter, found by the first test, replayed by the second. */
let poisonLetter: DeadLetter | undefined;

/** Runs the CLI against this file's mesh. */
function toolmesh(args: string[]): Promise<CliOutcome> {
  return runCli(args, env);
}

/** The first session event matching `predicate`, already seen or future. */
function nextResult(
  predicate: (m: ToolMessage) => boolean,
  timeoutMs = 30_000,
): Promise<ToolMessage> {
  return eventually(
    "a result on the session",
    () => {
      const found = events.find((e) => e.type === "result" && predicate(e.message));
      return found?.type === "result" ? found.message : undefined;
    },
    { timeoutMs },
  );
}

/** How many final messages the sessions stream holds for a call of the test session. */
async function storedResults(callId: string): Promise<number> {
  const subject = subjects.result(subjects.address("default", session.id), callId);
  const info = await jsm.streams.info(subjects.streams.sessions, { subjects_filter: subject });
  return info.state.subjects?.[subject] ?? 0;
}

async function workMessageGone(seq: number): Promise<true | undefined> {
  const stored = await jsm.streams.getMessage(subjects.streams.work, { seq });
  return stored === null ? true : undefined;
}

beforeAll(async () => {
  server = await startNatsServer();
  tmp = await mkdtemp(join(tmpdir(), "toolmesh-dlq-"));
  flagFile = join(tmp, "healthy");
  env = {
    NATS_URL: server.url,
    TOOLMESH_TOOLS_DIR: fixtureTools("tools-poison"),
    TOOLMESH_ACK_WAIT_MS: "1000",
    TOOLMESH_TOOLKIT_CONTEXT: JSON.stringify({ poison_flag: flagFile }),
  };
  resolver = await startService("resolver", env);
  executor = spawnExecutor(env);
  await executor.ready;
  await toolAvailable(resolver, ...["crasher", "echo"]);
  nc = await connect({ servers: server.url });
  js = jetstream(nc);
  jsm = await jetstreamManager(nc);
  client = new ToolmeshClient(nc, { defaultTimeoutMs: 30_000 });
  session = client.session("s-poison");
  session.onEvent((e) => events.push(e));
});

afterAll(async () => {
  session?.close();
  await nc?.close();
  await killExecutors();
  await killAllServices();
  await server?.stop();
  if (tmp !== undefined) await rm(tmp, { recursive: true, force: true });
});

describe("dead letters", () => {
  it("dead-letters a call that crashes its executor every time, answering it once", async () => {
    const handle = session.submit({ id: "p1", name: "crasher", arguments: { note: "poison" } });
    const { deaths, survivor } = await superviseUntil(handle.result, executor, env);
    executor = survivor;
    const message = await handle.result;

    // Each delivery killed a process (a delivery racing a dying connection may not).
    expect(deaths).toBeGreaterThanOrEqual(1);
    expect(deaths).toBeLessThanOrEqual(4);
    expect(message).toMatchObject({ role: "tool", tool_call_id: "p1", name: "crasher" });
    expect(message.error).toMatchObject({
      code: "tool_error",
      retryable: false,
      details: { dead_letter: true, reason: "max_deliveries", deliveries: 4 },
    });

    // The letter, with the headers that say where it came from.
    const letters = await listDeadLetters(nc, subjects, { tool: "crasher" });
    expect(letters).toHaveLength(1);
    const letter = letters[0] as DeadLetter;
    expect(letter).toMatchObject({
      tool: "crasher",
      reason: "max_deliveries",
      deliveries: 4,
      stream: subjects.streams.work,
      subject: subjects.work("crasher"),
      call_id: "p1",
      session_id: "s-poison",
      idempotency_key: "s-poison/p1",
    });
    const stored = await jsm.streams.getMessage(subjects.streams.dlq, { seq: letter.seq });
    expect(stored?.subject).toBe(subjects.dlq("crasher"));
    expect(stored?.header.get(Header.DlqStream)).toBe(subjects.streams.work);
    expect(stored?.header.get(Header.DlqSubject)).toBe(subjects.work("crasher"));
    expect(stored?.header.get(Header.DlqSequence)).toBe(String(letter.original_seq));
    expect(stored?.header.get(Header.DlqReason)).toBe("max_deliveries");
    expect(stored?.header.get(Header.DlqDeliveries)).toBe("4");
    // Moved, not copied: the keeper deletes the original right after answering the call.
    await eventually("the work message to leave the work stream", () =>
      workMessageGone(letter.original_seq ?? 0),
    );
    poisonLetter = letter;

    // The same process serves the next call of another tool.
    await survivor.ready;
    const next = await session.submit({ id: "e1", name: "echo", arguments: { text: "hi" } }).result;
    expect(next.error).toBeUndefined();
    expect(JSON.parse(next.content)).toMatchObject({
      echoed: { text: "hi" },
      pid: survivor.child.pid,
    });
    // Exactly one final message for the poison call, live and stored.
    expect(
      events.filter((e) => e.type === "result" && e.message.tool_call_id === "p1"),
    ).toHaveLength(1);
    expect(await storedResults("p1")).toBe(1);
  });

  it("lists, shows and replays the letter from the CLI once the tool is fixed", async () => {
    const letter = poisonLetter;
    if (letter === undefined) throw new Error("needs the letter of the first test");

    const list = await toolmesh(["dlq", "list", "--json"]);
    expect(list.code).toBe(0);
    expect(JSON.parse(list.stdout)).toEqual([letter]);
    const none = await toolmesh(["dlq", "list", "--tool", "echo", "--json"]);
    expect(JSON.parse(none.stdout)).toEqual([]);
    const text = await toolmesh(["dlq", "list"]);
    expect(text.stdout).toMatch(
      new RegExp(`^${letter.seq}\\s.*crasher\\s+max_deliveries\\s+4`, "m"),
    );

    const show = await toolmesh(["dlq", "show", String(letter.seq), "--json"]);
    expect(show.code).toBe(0);
    const detail = JSON.parse(show.stdout) as DeadLetterDetail;
    expect(detail).toMatchObject({ ...letter, body: { tool: "crasher", call_id: "p1" } });
    expect((detail.body as { arguments: unknown }).arguments).toEqual({ note: "poison" });

    const unknown = await toolmesh(["dlq", "show", "999999", "--json"]);
    expect(unknown.code).toBe(1);
    expect(JSON.parse(unknown.stdout)).toMatchObject({ error: { code: "invalid_request" } });

    // The fix: the fixture stops crashing once the flag file exists.
    await writeFile(flagFile, "fixed");
    const replay = await toolmesh(["dlq", "replay", String(letter.seq), "--json"]);
    expect(replay.code, replay.stderr).toBe(0);
    const outcome = JSON.parse(replay.stdout) as ReplayOutcome;
    const key = `s-poison/p1#replay-${letter.seq}`;
    expect(outcome).toMatchObject({
      seq: letter.seq,
      status: "replayed",
      stream: subjects.streams.work,
      subject: subjects.work("crasher"),
      msg_id: callKey(subjects.address("default", "s-poison"), key),
      idempotency_key: key,
      original_idempotency_key: "s-poison/p1",
      call_id: "p1",
      session_id: "s-poison",
      deleted: true,
    });

    // A new, second final message on the session: the replay's result.
    const healed = await nextResult((m) => m.tool_call_id === "p1" && m.error === undefined);
    expect(JSON.parse(healed.content)).toEqual({
      healed: true,
      key: `default/s-poison/${key}`,
      attempt: 1,
      args: { note: "poison" },
    });
    expect(await storedResults("p1")).toBe(2);
    const stored = await jsm.streams.getMessage(subjects.streams.work, {
      seq: outcome.stream_seq ?? 0,
    });
    expect(stored).toBeNull(); // the replayed work was consumed

    // The letter is gone; replaying it again is a typed error.
    const after = await toolmesh(["dlq", "list", "--json"]);
    expect(JSON.parse(after.stdout)).toEqual([]);
    const again = await toolmesh(["dlq", "replay", String(letter.seq)]);
    expect(again.code).toBe(1);
    expect(again.stdout).toContain(`invalid_request: no dead letter with sequence ${letter.seq}`);
  });

  it("dead-letters a work message that is not a resolved call and goes on", async () => {
    const garbage = Uint8Array.from([0xff, 0xfe, 0x00, 0x7b, 0x22]);
    const ack = await js.publish(subjects.work("echo"), garbage);
    const letter = await eventually("the garbage letter", async () =>
      (await listDeadLetters(nc, subjects)).find((l) => l.original_seq === ack.seq),
    );
    expect(letter).toMatchObject({
      tool: "echo",
      reason: "not a resolved call",
      deliveries: 1,
      stream: subjects.streams.work,
      subject: subjects.work("echo"),
    });
    expect(letter.call_id).toBeUndefined();
    await eventually("the garbage to leave the work stream", () => workMessageGone(ack.seq));

    const next = await session.submit({ id: "e2", name: "echo", arguments: { text: "after" } })
      .result;
    expect(next.error).toBeUndefined();
    expect(JSON.parse(next.content)).toMatchObject({ echoed: { text: "after" } });

    const show = await toolmesh(["dlq", "show", String(letter.seq), "--json"]);
    expect(JSON.parse(show.stdout)).toMatchObject({
      seq: letter.seq,
      body_base64: Buffer.from(garbage).toString("base64"),
    });
    expect((JSON.parse(show.stdout) as DeadLetterDetail).body).toBeUndefined();
    // Foreign bytes hold no call: replaying them could only dead-letter them again.
    const replay = await toolmesh(["dlq", "replay", String(letter.seq), "--json"]);
    expect(replay.code).toBe(1);
    expect(JSON.parse(replay.stdout)).toMatchObject({
      error: { code: "invalid_request", details: { seq: letter.seq } },
    });
    expect((await listDeadLetters(nc, subjects)).map((l) => l.seq)).toContain(letter.seq);
  });

  it("replays a calls-stream letter through the resolver as a new call", async () => {
    // Making the resolver fail a call every time is hard to do cleanly; the letter is put in
    // the dead-letter stream as the dead-letter keeper writes it instead.
    const callSubject = subjects.call(subjects.address("default", session.id));
    const request = {
      tool_call: {
        id: "c9",
        type: "function",
        function: { name: "echo", arguments: '{"text":"again"}' },
      },
      session_id: session.id,
      timeout_ms: 20_000,
    };
    const h = createHeaders();
    h.set(Header.DlqStream, subjects.streams.calls);
    h.set(Header.DlqSubject, callSubject);
    h.set(Header.DlqSequence, "424242");
    h.set(Header.DlqReason, "max_deliveries");
    h.set(Header.DlqDeliveries, "5");
    const { seq } = await js.publish(subjects.dlq("echo"), encodeJson(request), { headers: h });

    const letter = (await listDeadLetters(nc, subjects, { tool: "echo" })).find(
      (l) => l.seq === seq,
    );
    expect(letter).toMatchObject({
      seq,
      tool: "echo",
      stream: subjects.streams.calls,
      subject: callSubject,
      original_seq: 424242,
      deliveries: 5,
      call_id: "c9",
      session_id: session.id,
      idempotency_key: `${session.id}/c9`,
    });

    const replay = await toolmesh(["dlq", "replay", String(seq), "--json"]);
    expect(replay.code).toBe(0);
    expect(JSON.parse(replay.stdout)).toMatchObject({
      status: "replayed",
      stream: subjects.streams.calls,
      subject: callSubject,
      idempotency_key: `${session.id}/c9#replay-${seq}`,
      deleted: true,
    });
    const message = await nextResult((m) => m.tool_call_id === "c9");
    expect(message.error).toBeUndefined();
    expect(JSON.parse(message.content)).toMatchObject({ echoed: { text: "again" } });
    expect((await listDeadLetters(nc, subjects, { tool: "echo" })).some((l) => l.seq === seq)).toBe(
      false,
    );
  });

  it("queues work once more when its deliveries ran out faster than its ack wait, then dead-letters it", async () => {
    // Nobody serves "stalled": this test takes its work and hands it back at once, as a server
    // delivering into a pull request whose requester is gone does (ADR 0030).
    const consumer = subjects.workConsumer("stalled");
    await ensureDurableConsumer(jsm, {
      stream: subjects.streams.work,
      name: consumer,
      filterSubject: subjects.work("stalled"),
      ackWaitMs: 1_000,
      maxDeliver: 3,
      maxAckPending: 1_000,
    });
    const address = subjects.address("default", "s-stalled");
    const call = {
      ...resolvedCall({ id: "st1", tool: "stalled", address }),
      session_id: "s-stalled",
    };
    const finals: ToolMessage[] = [];
    nc.subscribe(subjects.result(address, "st1"), {
      callback: (err, msg) => {
        if (err === null) finals.push(decodeJson(msg.data) as ToolMessage);
      },
    });
    const h = deadlineHeaders(call);
    h.set(Header.RecordRevision, "7");
    const first = await js.publish(subjects.work("stalled"), encodeJson(call), {
      headers: h,
      msgID: callKey(address, call.idempotency_key),
    });

    const pull = await js.consumers.get(subjects.streams.work, consumer);
    const deliveries: { seq: number; count: number; requeued: string; revision: string }[] = [];
    while (deliveries.length < 6) {
      const msg = await pull.next({ expires: 5_000 });
      if (msg === null) throw new Error(`no delivery after ${JSON.stringify(deliveries)}`);
      deliveries.push({
        seq: msg.seq,
        count: msg.info.deliveryCount,
        requeued: msg.headers?.get(Header.Requeued) ?? "",
        revision: msg.headers?.get(Header.RecordRevision) ?? "",
      });
      msg.nak();
    }
    const second = deliveries[3]?.seq ?? 0;
    expect(second).toBeGreaterThan(first.seq);
    expect(deliveries).toEqual([
      ...[1, 2, 3].map((count) => ({ seq: first.seq, count, requeued: "", revision: "7" })),
      // Queued again without the record's revision: whoever takes it reads the record.
      ...[1, 2, 3].map((count) => ({ seq: second, count, requeued: "3", revision: "" })),
    ]);
    // Deleted right after it was published again.
    await eventually("the used-up work to leave the work stream", () => workMessageGone(first.seq));

    // The second time, it is dead-lettered (the server says so when it is asked for more): one
    // final message, no third round.
    const third = pull.next({ expires: 3_000 });
    const letter = await eventually(
      "the stalled call's letter",
      async () => (await listDeadLetters(nc, subjects, { tool: "stalled" }))[0],
    );
    expect(letter).toMatchObject({ reason: "max_deliveries", deliveries: 3, original_seq: second });
    await eventually("the final message", async () => finals[0]);
    expect(finals[0]?.error).toMatchObject({
      code: "tool_error",
      details: { dead_letter: true, deliveries: 3 },
    });
    expect(await third).toBeNull();
    expect(finals).toHaveLength(1);
  });
});
