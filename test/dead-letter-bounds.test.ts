import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import type { JetStreamManager } from "@nats-io/jetstream";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { ToolmeshClient } from "@toolmesh/client";
import type { Executor, ToolModule } from "@toolmesh/tool-host";
import { startExecutor } from "@toolmesh/tool-host";
import type { Resolver } from "@toolmesh/resolver";
import { startResolver } from "@toolmesh/resolver";
import { ToolRegistry } from "@toolmesh/registry";
import { ownerCallPlane } from "@toolmesh/call-store";
import type { PurgeOutcome } from "@toolmesh/control-plane";
import { createSubjects } from "@toolmesh/protocol";
import { createLogger, initTelemetry } from "@toolmesh/telemetry";
import { runCli } from "./helpers/cli.js";
import { eventually } from "./helpers/eventually.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { startRogueAndVictim } from "./helpers/owner-accounts.js";

// A tool owner flooding the dead-letter stream (ADR 0051), under the accounts `toolmesh auth
// config` generates: it may dead-letter only work it was given, each message once, and the
// stream keeps at most TOOLMESH_MAX_DEAD_LETTERS letters in its share of TOOLMESH_STORE_BYTES,
// the oldest going first, while another owner's calls keep being answered. The operator's
// `toolmesh dlq purge` gives the space back, by the server's count. Runs on whichever
// nats-server is first on the PATH (CI: 2.9.10 and the current).
const subjects = createSubjects({ prefix: "dlqb" });
const log = createLogger({ service: "test", level: "silent" });
const STORE_BYTES = 40 * 1024 * 1024; // the dead letters' share: 4 MiB
const MAX_LETTERS = 40;
const LETTER = "x".repeat(200 * 1024);

let server: NatsServerHandle;
let mesh: NatsConnection;
let rogue: NatsConnection;
let globexNc: NatsConnection;
let jsm: JetStreamManager;
let registry: ToolRegistry;
let resolver: Resolver;
let globex: Executor;
let client: ToolmeshClient;

const echo: ToolModule = {
  name: "echo",
  description: "Echoes its text.",
  parameters: { type: "object", properties: { text: { type: "string" } }, required: ["text"] },
  handler: (args: Record<string, unknown>) => ({ echoed: args.text }),
};

beforeAll(async () => {
  ({ server, mesh, rogue, globexNc } = await startRogueAndVictim(subjects));
  jsm = await jetstreamManager(mesh);
  registry = await ToolRegistry.open(mesh, { subjects, log });
  const tracer = initTelemetry({ serviceName: "test", env: {} }).tracer;
  const streamLimits = { storeBytes: STORE_BYTES, maxDeadLetters: MAX_LETTERS };
  resolver = await startResolver({ nc: mesh, subjects, registry, log, tracer, streamLimits });
  globex = await startExecutor({
    nc: globexNc,
    subjects,
    ownerAccount: "globex",
    tools: [echo],
    log,
    tracer,
  });
  await ownerCallPlane(rogue, { subjects, owner: "acme" }).register({
    name: "acme.tool",
    description: "The rogue's own tool.",
    summary: "The rogue's own tool.",
    kind: "builtin",
    parameters: { type: "object", properties: {} },
  });
  client = new ToolmeshClient(mesh, { prefix: "dlqb", defaultTimeoutMs: 15_000 });
}, 60_000);

afterAll(async () => {
  await globex?.stop(1_000);
  await resolver?.stop(1_000);
  registry?.close();
  await Promise.all([mesh?.close(), rogue?.close(), globexNc?.close()]);
  await server?.stop();
});

describe("dead letters", () => {
  it("are bounded in count and bytes, the oldest going, while others' calls are answered", async () => {
    const plane = ownerCallPlane(rogue, { subjects, owner: "acme" });
    const session = client.session("steady");
    const js = jetstream(mesh);
    const subject = subjects.work("acme.tool", "acme");
    const letter = (seq: number) => ({
      tool: "acme.tool",
      reason: "not a resolved call",
      stream: subjects.workStream("acme"),
      subject,
      seq,
      deliveries: 1,
      data: new Uint8Array(),
    });
    let answered = 0;
    for (let i = 0; i < 60; i++) {
      // Work the owner was given (foreign bytes its executor cannot run), dead-lettered once.
      const { seq } = await js.publish(subject, `${i}:${LETTER}`);
      await plane.deadLetter(letter(seq));
      await expect(plane.deadLetter(letter(seq))).rejects.toMatchObject({
        code: "invalid_request",
      });
      if (i % 10 === 0) {
        const message = await session.submit({
          id: `e${i}`,
          name: "echo",
          arguments: { text: "hi" },
        }).result;
        expect(JSON.parse(message.content)).toEqual({ echoed: "hi" });
        answered++;
      }
      const state = (await jsm.streams.info(subjects.streams.dlq)).state;
      expect(state.messages).toBeLessThanOrEqual(MAX_LETTERS);
      expect(state.bytes).toBeLessThanOrEqual(STORE_BYTES * 0.1);
    }
    expect(answered).toBe(6);
    // The oldest went: the newest letter is kept, the first is not.
    const dlq = await jsm.streams.info(subjects.streams.dlq);
    const first = await jsm.streams.getMessage(subjects.streams.dlq, { seq: dlq.state.first_seq });
    expect(Number(new TextDecoder().decode(first?.data).split(":")[0])).toBeGreaterThan(0);
    const last = await jsm.streams.getMessage(subjects.streams.dlq, { seq: dlq.state.last_seq });
    expect(new TextDecoder().decode(last?.data).split(":")[0]).toBe("59");

    // The operator's purge gives the space back, by the server's count: the account's storage
    // less every other stream's bytes falls by what the letters held. The resolver keeps
    // rewriting its tenants' stored bytes, so the account is read between two equal readings
    // of the other streams.
    const othersBytes = async (): Promise<number> => {
      let bytes = 0;
      for await (const info of jsm.streams.list())
        if (info.config.name !== subjects.streams.dlq) bytes += info.state.bytes;
      return bytes;
    };
    const lettersShare = (): Promise<number> =>
      eventually("the other streams still for one account reading", async () => {
        const others = await othersBytes();
        const storage = (await jsm.getAccountInfo()).storage;
        return (await othersBytes()) === others ? storage - others : undefined;
      });
    const before = await lettersShare();
    const out = await runCli(["dlq", "purge", "--tool", "acme.tool", "--json"], {
      NATS_URL: server.url,
      TOOLMESH_PREFIX: subjects.prefix,
      NATS_USER: "operator",
      NATS_PASSWORD: "operator",
    });
    expect(out.code, out.stderr).toBe(0);
    const purge = JSON.parse(out.stdout) as PurgeOutcome;
    expect(purge).toMatchObject({ purged: dlq.state.messages, bytes_after: 0, letters_after: 0 });
    expect(purge.bytes_before).toBe(dlq.state.bytes);
    expect(before - (await lettersShare())).toBeGreaterThanOrEqual(purge.bytes_before);
    const message = await session.submit({ id: "last", name: "echo", arguments: { text: "ok" } })
      .result;
    expect(JSON.parse(message.content)).toEqual({ echoed: "ok" });
    session.close();
  });
});
