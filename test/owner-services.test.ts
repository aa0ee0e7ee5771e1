import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import type { MeshCallPlane, OwnerCallPlane } from "@toolmesh/call-store";
import { openCallPlane, ownerCallPlane } from "@toolmesh/call-store";
import type { OwnerServices } from "@toolmesh/control-plane";
import { startOwnerServices } from "@toolmesh/control-plane";
import { ToolRegistry } from "@toolmesh/registry";
import type { ToolMessage } from "@toolmesh/protocol";
import { ToolmeshError, createSubjects, decodeJson, encodeJson } from "@toolmesh/protocol";
import { createLogger } from "@toolmesh/telemetry";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { ownerAccountsConfig } from "./helpers/owner-accounts.js";

// The mesh's owner services (ADR 0031) against a real server laid out in the accounts
// `toolmesh auth config` generates: the mesh in TOOLMESH (JetStream), tool owners acme and
// globex each in an account of their own without JetStream, reaching only their own
// `{p}.v1.owner.{o}.*`, registration of the names granted to them, and their own work streams.
const subjects = createSubjects({ prefix: "own" });
const log = createLogger({ service: "test", level: "silent" });

let server: NatsServerHandle;
let mesh: NatsConnection;
let acmeNc: NatsConnection;
let globexNc: NatsConnection;
let plane: MeshCallPlane;
let registry: ToolRegistry;
let services: OwnerServices;
let acme: OwnerCallPlane;
let globex: OwnerCallPlane;
const address = { tenant: "default", session: "s" };

beforeAll(async () => {
  server = await startNatsServer({
    config: ownerAccountsConfig(subjects, {
      acme: ["echo", "first", "gone", "acme-tool"],
      globex: ["globex-tool"],
    }),
  });
  mesh = await connect({ servers: server.url, user: "mesh", pass: "mesh" });
  acmeNc = await connect({ servers: server.url, user: "acme", pass: "acme" });
  globexNc = await connect({ servers: server.url, user: "globex", pass: "globex" });
  plane = await openCallPlane(mesh, { subjects });
  registry = await ToolRegistry.open(mesh, { subjects, log });
  services = startOwnerServices({ nc: mesh, subjects, plane, registry, log });
  await mesh.flush();
  acme = ownerCallPlane(acmeNc, { subjects, owner: "acme" });
  globex = ownerCallPlane(globexNc, { subjects, owner: "globex" });
}, 30_000);

afterAll(async () => {
  await services?.stop(1_000);
  registry?.close();
  await Promise.all([mesh?.close(), acmeNc?.close(), globexNc?.close()]);
  await server?.stop();
});

const definition = (name: string) => ({
  name,
  description: `the ${name} tool`,
  summary: `the ${name} tool`,
  kind: "builtin" as const,
  parameters: { type: "object", properties: {} },
});

/** Waits until the registry's live copy has `name` owned by `owner`. */
async function registered(name: string, owner: string): Promise<void> {
  for (let i = 0; registry.get(name)?.definition.owner !== owner; i++) {
    if (i === 100) throw new Error(`"${name}" never became ${owner}'s`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** Records an accepted call of `tool`, as the resolver does. */
async function accept(callId: string, tool: string): Promise<void> {
  await plane.store.accept({
    idempotency_key: `s/${callId}`,
    call_id: callId,
    session_id: "s",
    address,
    tool,
    args_hash: "h",
    state: "accepted",
    deadline_at: plane.clock.now() + 60_000,
  });
}

const target = (callId: string) => ({ idempotency_key: `s/${callId}`, call_id: callId, address });
const result = (callId: string, tool: string, content = "ok"): ToolMessage => ({
  role: "tool",
  tool_call_id: callId,
  name: tool,
  session_id: "s",
  content,
});

async function refusal(promise: Promise<unknown>): Promise<{ code: string; message: string }> {
  const err = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(ToolmeshError);
  return err as ToolmeshError;
}

async function storedResult(callId: string): Promise<ToolMessage | undefined> {
  const stored = await plane.jsm.streams
    .getMessage(subjects.streams.sessions, { last_by_subj: subjects.result(address, callId) })
    .catch(() => null);
  return stored === null ? undefined : (decodeJson(stored.data) as ToolMessage);
}

describe("register", () => {
  it("files the tool under its owner, whatever the definition says, and creates its work consumer", async () => {
    const outcome = await acme.register({ ...definition("echo"), owner: "globex" });
    expect(outcome.status).toBe("created");
    await registered("echo", "acme");
    // On the owner's own work stream, which the mesh created with the work stream's settings.
    const consumer = await plane.jsm.consumers.info(
      subjects.workStream("acme"),
      subjects.workConsumer("echo"),
    );
    expect(consumer.config.filter_subject).toBe(subjects.work("echo", "acme"));
    const stream = await plane.jsm.streams.info(subjects.workStream("acme"));
    const work = await plane.jsm.streams.info(subjects.streams.work);
    expect(stream.config.subjects).toEqual([subjects.ownerWork("acme")]);
    // The mesh's work stream's settings, but its own byte bound (TOOLMESH_OWNER_STORE_BYTES).
    expect({ ...stream.config, name: "", subjects: [] }).toEqual({
      ...work.config,
      name: "",
      subjects: [],
      max_bytes: 256 * 1024 ** 2,
    });
    expect(registry.get("echo")?.definition.owner_account).toBe(true);
    expect((await acme.register(definition("echo"))).status).toBe("unchanged");
  });

  it("refuses a name a tool of the mesh account holds (first wins)", async () => {
    await registry.register({ ...definition("first"), owner: "executor" });
    expect(await acme.register(definition("first"))).toEqual({
      status: "conflict",
      owner: "executor",
    });
  });

  it("registers only names granted to the owner, or in its namespace (ADR 0041)", async () => {
    expect((await globex.register(definition("globex.anything"))).status).toBe("created");
    // Not granted: the register subject of that name crosses no import of globex's account.
    for (const name of ["acme-tool", "acme.x", "other"]) {
      const err = await refusal(globex.register(definition(name)));
      expect(err.code).toBe("permission_denied");
    }
    // A granted subject with a body naming another tool is refused by the mesh.
    for (const name of ["acme-tool", "globex-tool.x"]) {
      const reply = await globexNc.request(
        subjects.ownerRegister("globex", "globex-tool"),
        encodeJson({ definition: definition(name) }),
        { timeout: 5_000 },
      );
      expect(decodeJson(reply.data)).toMatchObject({ error: { code: "invalid_request" } });
    }
    expect(registry.get("acme-tool")).toBeUndefined();
  });

  it("answers a malformed definition with invalid_request", async () => {
    // @ts-expect-error a definition without its summary and kind, malformed on purpose
    const err = await refusal(acme.register({ name: "", description: "x", parameters: {} }));
    expect(err.code).toBe("invalid_request");
    expect(err.message).toMatch(/malformed register request/);
  });

  it("lets only the owner remove a tool", async () => {
    await acme.register(definition("gone"));
    await registered("gone", "acme");
    expect((await refusal(globex.unregister("gone"))).code).toBe("permission_denied");
    expect(await acme.unregister("gone")).toBe(true);
    expect(await acme.unregister("gone")).toBe(false);
  });
});

describe("calls", () => {
  beforeAll(async () => {
    await acme.register(definition("acme-tool"));
    await globex.register(definition("globex-tool"));
    await registered("acme-tool", "acme");
    await registered("globex-tool", "globex");
  });

  it("reads the record of the owner's call, and refuses another owner", async () => {
    await accept("r1", "acme-tool");
    const stored = await acme.store.get(target("r1"));
    expect(stored?.record).toMatchObject({ call_id: "r1", tool: "acme-tool", state: "accepted" });
    expect((await refusal(globex.store.get(target("r1")))).code).toBe("permission_denied");
    expect(await acme.store.get(target("nothing"))).toBeUndefined();
  });

  it("ends the owner's call once, with the mesh's compare-and-set", async () => {
    await accept("f1", "acme-tool");
    expect(await acme.finalize(target("f1"), result("f1", "acme-tool", "first"))).toBe(true);
    expect(await acme.finalize(target("f1"), result("f1", "acme-tool", "second"))).toBe(false);
    expect((await storedResult("f1"))?.content).toBe("first");
  });

  it("refuses a final result for another owner's call, and publishes nothing", async () => {
    await accept("f2", "acme-tool");
    const forged = result("f2", "acme-tool", "forged");
    expect((await refusal(globex.finalize(target("f2"), forged))).code).toBe("permission_denied");
    // Claiming its own tool's name does not help: the stored record decides.
    const renamed = result("f2", "globex-tool", "forged");
    expect((await refusal(globex.finalize(target("f2"), renamed))).code).toBe("permission_denied");
    expect(await storedResult("f2")).toBeUndefined();
    expect((await acme.store.get(target("f2")))?.record.state).toBe("accepted");
  });

  it("refuses a final message that names another call, tool or session", async () => {
    await accept("f3", "acme-tool");
    for (const message of [
      result("other", "acme-tool"),
      result("f3", "first"),
      { ...result("f3", "acme-tool"), session_id: "elsewhere" },
    ]) {
      expect((await refusal(acme.finalize(target("f3"), message))).code).toBe("invalid_request");
    }
    expect(await storedResult("f3")).toBeUndefined();
  });

  it("ends a call from the record its resolver kept, with no read, and checks it all the same", async () => {
    /** Keeps the record as the resolver does when it routes an owner's call. */
    const remember = async (callId: string): Promise<void> => {
      await accept(callId, "acme-tool");
      const stored = await plane.store.get(target(callId));
      if (stored === undefined) throw new Error(`no record of ${callId}`);
      plane.store.remember(target(callId), stored);
    };
    const reads: string[] = [];
    const tap = await connect({ servers: server.url, user: "mesh", pass: "mesh" });
    tap.subscribe(`$JS.API.STREAM.MSG.GET.KV_${subjects.callsBucket}`, {
      callback: (_, msg) => {
        reads.push(msg.subject);
      },
    });
    tap.subscribe(`$JS.API.DIRECT.GET.KV_${subjects.callsBucket}.>`, {
      callback: (_, msg) => {
        reads.push(msg.subject);
      },
    });
    await tap.flush();
    try {
      await remember("k1");
      await tap.flush();
      reads.length = 0; // the test's own read
      expect(await acme.finalize(target("k1"), result("k1", "acme-tool", "kept"))).toBe(true);
      await mesh.flush();
      await tap.flush();
      expect(reads).toEqual([]);
      expect((await storedResult("k1"))?.content).toBe("kept");
      // Another owner, or a message naming another call, is refused as when the record is read.
      await remember("k2");
      const forged = result("k2", "globex-tool", "forged");
      expect((await refusal(globex.finalize(target("k2"), forged))).code).toBe("permission_denied");
      await remember("k3");
      expect((await refusal(acme.finalize(target("k3"), result("other", "acme-tool")))).code).toBe(
        "invalid_request",
      );
      expect(await storedResult("k2")).toBeUndefined();
      expect(await storedResult("k3")).toBeUndefined();
      // A call that ended meanwhile (cancelled): the kept record is no longer the stored one.
      await remember("k4");
      expect(await plane.finalize(target("k4"), result("k4", "acme-tool", "cancelled"))).toBe(true);
      expect(await acme.finalize(target("k4"), result("k4", "acme-tool", "late"))).toBe(false);
      expect((await storedResult("k4"))?.content).toBe("cancelled");
    } finally {
      await tap.close();
    }
  });

  it("refuses to end a call it has no record of", async () => {
    const err = await refusal(acme.finalize(target("ghost"), result("ghost", "acme-tool")));
    expect(err.code).toBe("invalid_request");
    expect(await storedResult("ghost")).toBeUndefined();
  });

  it("sends progress of the owner's running call to its session, not another owner's", async () => {
    await accept("p1", "acme-tool");
    const seen: unknown[] = [];
    const sub = mesh.subscribe(subjects.progress(address, "p1"), {
      callback: (_, msg) => {
        seen.push(decodeJson(msg.data));
      },
    });
    await mesh.flush();
    const event = (data: string) => ({
      tool_call_id: "p1",
      name: "acme-tool",
      session_id: "s",
      seq: 0,
      attempt: 1,
      data,
      at: Date.now(),
    });
    globex.publishProgress(target("p1"), event("from globex"));
    acme.publishProgress(target("p1"), event("from acme"));
    await expect.poll(() => seen.length, { timeout: 5_000 }).toBe(1);
    await acmeNc.flush();
    await globexNc.flush();
    sub.unsubscribe();
    expect(seen).toMatchObject([{ data: "from acme" }]);
  });

  it("keeps a dead letter of the owner's tool, and refuses one of another owner's", async () => {
    await acme.register(definition("acme-tool"));
    await registered("acme-tool", "acme");
    // Foreign bytes in the owner's work stream: the work its executor gives up on.
    const work = await plane.js.publish(subjects.work("acme-tool", "acme"), "junk");
    const letter = {
      reason: "not a resolved call",
      stream: subjects.streams.work,
      seq: work.seq,
      deliveries: 1,
      // Not what is kept: the letter is the message the work stream holds.
      data: new TextEncoder().encode("what the owner says"),
    };
    await acme.deadLetter({
      ...letter,
      tool: "acme-tool",
      subject: subjects.work("acme-tool", "acme"),
    });
    const kept = await plane.jsm.streams.getMessage(subjects.streams.dlq, {
      last_by_subj: subjects.dlq("acme-tool"),
    });
    expect(new TextDecoder().decode(kept?.data)).toBe("junk");
    // Taken out of the work stream, so it is dead-lettered once.
    expect(await plane.jsm.streams.getMessage(subjects.workStream("acme"), { seq: work.seq })).toBe(
      null,
    );
    const again = await refusal(
      acme.deadLetter({
        ...letter,
        tool: "acme-tool",
        subject: subjects.work("acme-tool", "acme"),
      }),
    );
    expect(again.code).toBe("invalid_request");
    const refused = await refusal(
      acme.deadLetter({ ...letter, tool: "globex-tool", subject: subjects.work("globex-tool") }),
    );
    expect(refused.code).toBe("permission_denied");
    for (const subject of [subjects.work("acme-tool"), subjects.work("acme-tool", "globex")]) {
      const elsewhere = await refusal(acme.deadLetter({ ...letter, tool: "acme-tool", subject }));
      expect(elsewhere.code).toBe("invalid_request");
    }
  });
});

describe("bad input", () => {
  it("answers a body that is not JSON, or of another shape, with invalid_request", async () => {
    for (const [service, body] of [
      ["record", "{not json"],
      ["finalize", encodeJson({ call: { call_id: 1 } })],
      ["nothing", "{}"],
    ] as const) {
      const reply = await acmeNc.request(`own.v1.owner.acme.${service}`, body, { timeout: 5_000 });
      expect(decodeJson(reply.data)).toMatchObject({ error: { code: "invalid_request" } });
    }
  });
});
