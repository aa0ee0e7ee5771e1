// Guarantee 4 (DESIGN.md): bad input never crashes a service and never poisons a queue; it
// gets a typed error naming what was wrong. Every case runs against a real nats-server and
// the resolver and executor as separate processes; after each case the processes must still
// be alive and a valid call must still work.
import { randomUUID } from "node:crypto";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection, Subscription } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import type { JetStreamClient, PubAck } from "@nats-io/jetstream";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { ToolmeshClient } from "@toolmesh/client";
import type { CallInput, SubmitOptions } from "@toolmesh/client";
import {
  MAX_ARGUMENT_DEPTH,
  argumentsHash,
  createSubjects,
  encodeJson,
  subjectToken,
} from "@toolmesh/protocol";
import type { Rejection, SessionAddress, ToolMessage } from "@toolmesh/protocol";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { fixtureTools, killAllServices, startService, toolAvailable } from "./helpers/mesh.js";
import type { ServiceProcess } from "./helpers/mesh.js";
import { present } from "./helpers/present.js";

const TENANT = "default";
/** The prefix of a second mesh on the same server whose streams take at most 64 KiB. */
const SMALL_PREFIX = "small";
const SMALL_MAX_MESSAGE_BYTES = 65_536;

const subjects = createSubjects();
const smallSubjects = createSubjects({ prefix: SMALL_PREFIX });

let server: NatsServerHandle;
let nc: NatsConnection;
let js: JetStreamClient;
let client: ToolmeshClient;
let smallClient: ToolmeshClient;
let resolver: ServiceProcess;
let executor: ServiceProcess;
let smallResolver: ServiceProcess;
let env: Record<string, string>;
let ledgerDir: string;
let allResults: Subscription;
/** Every final message published on any session of the main mesh, with its subject. */
const published: { subject: string; message: ToolMessage }[] = [];

beforeAll(async () => {
  server = await startNatsServer();
  ledgerDir = await mkdtemp(join(tmpdir(), "toolmesh-bad-input-"));
  env = {
    NATS_URL: server.url,
    TOOLMESH_TOOLS_DIR: fixtureTools("tools-bad"),
    TOOLMESH_TOOLKIT_CONTEXT: JSON.stringify({ ledgerDir }),
    // Calls are remembered ~50 days here, so budgets past a Node timer's 2^31 ms are valid.
    TOOLMESH_CALL_RETENTION_MS: String(2 ** 32),
  };
  [resolver, executor, smallResolver] = await Promise.all([
    startService("resolver", env),
    startService("executor", env),
    startService("resolver", {
      ...env,
      TOOLMESH_PREFIX: SMALL_PREFIX,
      TOOLMESH_MAX_MESSAGE_BYTES: String(SMALL_MAX_MESSAGE_BYTES),
    }),
  ]);
  await toolAvailable(
    resolver,
    "strict",
    "echo_any",
    "measure",
    "evil_pattern",
    "bad.input.dotted",
    "ledger",
    "slow",
  );
  nc = await connect({ servers: server.url });
  js = jetstream(nc);
  client = new ToolmeshClient(nc, { defaultTimeoutMs: 15_000 });
  smallClient = new ToolmeshClient(nc, { prefix: SMALL_PREFIX, defaultTimeoutMs: 15_000 });
  allResults = nc.subscribe(subjects.allResults, {
    callback: (err, msg) => {
      if (err === null) published.push({ subject: msg.subject, message: msg.json() });
    },
  });
});

afterAll(async () => {
  allResults?.unsubscribe();
  await nc?.close();
  await killAllServices();
  await server?.stop();
  if (ledgerDir !== undefined) await rm(ledgerDir, { recursive: true, force: true });
});

function expectAlive(...services: ServiceProcess[]): void {
  for (const service of services) {
    expect(
      { pid: service.pid, exitCode: service.child.exitCode, signal: service.child.signalCode },
      service.stderr(),
    ).toEqual({ pid: service.pid, exitCode: null, signal: null });
  }
}

let healthChecks = 0;

// After every case: nothing crashed, and a valid call still goes all the way through.
afterEach(async () => {
  expectAlive(resolver, executor, smallResolver);
  const session = client.session("s-health");
  const message = await session.submit({
    id: `health-${healthChecks++}`,
    name: "strict",
    arguments: { name: "ok", count: 1 },
  }).result;
  session.close();
  expect(message.error).toBeUndefined();
  expect(JSON.parse(message.content)).toEqual({ args: { name: "ok", count: 1, mode: "fast" } });
  expectAlive(resolver, executor, smallResolver);
});

/** Submits one call through the client on its own session and returns the final message. */
async function call(
  sessionId: string,
  input: CallInput,
  options: SubmitOptions = {},
): Promise<ToolMessage> {
  const session = client.session(sessionId);
  try {
    return await session.submit(input, options).result;
  } finally {
    session.close();
  }
}

/** Final messages (and rejections) arriving on one session, as they come. */
class SessionWatch {
  readonly messages: { subject: string; message: ToolMessage }[] = [];
  readonly rejections: Rejection[] = [];
  readonly #sub: Subscription;
  readonly #waiters = new Set<() => void>();

  constructor(address: SessionAddress, subjectsOf = subjects) {
    this.#sub = nc.subscribe(subjectsOf.sessionEvents(address), {
      callback: (err, msg) => {
        if (err !== null) return;
        const kind = subjectsOf.sessionEventKind(msg.subject);
        if (kind === "result") this.messages.push({ subject: msg.subject, message: msg.json() });
        else if (kind === "rejected") this.rejections.push(msg.json());
        else return;
        for (const wake of this.#waiters) wake();
      },
    });
  }

  /** The first result whose `tool_call_id` is `callId`; rejects after `timeoutMs`. */
  result(callId: string, timeoutMs = 10_000): Promise<ToolMessage> {
    return this.#first(
      () => this.messages.find((m) => m.message.tool_call_id === callId)?.message,
      `result for ${callId}`,
      timeoutMs,
    );
  }

  /** The rejection of the submission stored at `seq`; rejects after `timeoutMs`. */
  rejection(seq: number, timeoutMs = 10_000): Promise<Rejection> {
    return this.#first(
      () => this.rejections.find((r) => r.seq === seq),
      `rejection of ${seq}`,
      timeoutMs,
    );
  }

  async #first<T>(find: () => T | undefined, what: string, timeoutMs: number): Promise<T> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const found = find();
      if (found !== undefined) return found;
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`no ${what} within ${timeoutMs} ms`);
      await new Promise<void>((resolve) => {
        const wake = (): void => {
          clearTimeout(timer);
          this.#waiters.delete(wake);
          resolve();
        };
        const timer = setTimeout(wake, left);
        this.#waiters.add(wake);
      });
    }
  }

  close(): void {
    this.#sub.unsubscribe();
  }
}

/**
 * Publishes raw bytes (or any JSON value) on a session's call subject with JetStream, as a
 * frontend in another language might, and waits for the answer: the result for `callId`,
 * or for `invalid-<seq>` when the call has no usable id.
 */
async function rawCall(
  sessionId: string,
  body: unknown,
  options: { callId?: string; msgId?: string; tenant?: string } = {},
): Promise<{ ack: PubAck; message: ToolMessage }> {
  const address = subjects.address(options.tenant ?? TENANT, sessionId);
  const watch = new SessionWatch(address);
  try {
    const bytes = body instanceof Uint8Array ? body : encodeJson(body);
    const ack = await js.publish(subjects.call(address), bytes, {
      msgID: options.msgId ?? randomUUID(),
    });
    const message = await watch.result(options.callId ?? `invalid-${ack.seq}`);
    return { ack, message };
  } finally {
    watch.close();
  }
}

/** A call request envelope for raw publishing. */
function envelope(
  sessionId: string,
  id: string,
  name: string,
  args: unknown,
  extra: Record<string, unknown> = {},
): Record<string, unknown> {
  return {
    tool_call: { id, type: "function", function: { name, arguments: args } },
    session_id: sessionId,
    ...extra,
  };
}

/** `[path, keyword, expected, received]` of each `invalid_parameters` error. */
function parameterErrors(message: ToolMessage): unknown[][] {
  expect(message.error?.code).toBe("invalid_parameters");
  const errors = message.error?.details?.errors as {
    path: string;
    keyword: string;
    expected: unknown;
    received: unknown;
  }[];
  return errors.map((e) => [e.path, e.keyword, e.expected, e.received]);
}

const json = (message: ToolMessage): Record<string, unknown> => {
  expect(message.error).toBeUndefined();
  return JSON.parse(message.content) as Record<string, unknown>;
};

describe("function.arguments that are not an object", () => {
  it("answers truncated JSON with invalid_arguments locating the error", async () => {
    const text = '{"name": "x", "count": 1';
    const message = await call("s-args", { id: "a1", name: "strict", arguments: text });
    expect(message.error).toMatchObject({ code: "invalid_arguments", retryable: false });
    expect(message.error?.details).toMatchObject({
      position: text.length,
      line: 1,
      column: text.length + 1,
    });
    expect(message).toMatchObject({ tool_call_id: "a1", name: "strict", attempts: 0 });
  });

  it.each([
    ["an array", "[1, 2]", "array"],
    ["a string holding a JSON string", JSON.stringify(JSON.stringify({ name: "x" })), "string"],
    ["null", "null", "null"],
    ["a number", "42", "number"],
    ["a boolean", "true", "boolean"],
  ])("answers JSON text that is %s with invalid_arguments", async (_, text, received) => {
    const message = await call("s-args", { id: `a-${received}`, name: "strict", arguments: text });
    expect(message.error).toMatchObject({ code: "invalid_arguments", details: { received } });
  });

  it.each([
    ["null", null],
    ["a number", 42],
    ["an array", [1, 2]],
  ])("answers arguments that are %s in object form with invalid_arguments", async (_, args) => {
    const id = `a-raw-${String(args)}`;
    const { message } = await rawCall("s-args-raw", envelope("s-args-raw", id, "strict", args), {
      callId: id,
    });
    expect(message.error?.code).toBe("invalid_arguments");
    expect(message.error?.details?.issues).toEqual([
      expect.objectContaining({ path: "/tool_call/function/arguments" }),
    ]);
  });

  // The client answers these itself, differently from the resolver (reported): the short form
  // reads null as "no arguments", and a malformed OpenAI-shaped call is `invalid_request`.
  it("reads null arguments in the client's short form as no arguments", async () => {
    const message = await call("s-args", {
      id: "a-null-short",
      name: "strict",
      arguments: null as unknown as string,
    });
    expect(message.error).toMatchObject({
      code: "missing_arguments",
      details: { missing_required: ["name", "count"] },
    });
  });

  it("refuses null arguments of an OpenAI-shaped call in the client, before sending", async () => {
    const message = await call("s-args", {
      id: "a-null-openai",
      type: "function",
      function: { name: "strict", arguments: null as unknown as string },
    });
    expect(message.error).toMatchObject({
      code: "invalid_arguments",
      details: { issues: [expect.objectContaining({ path: "/tool_call/function/arguments" })] },
    });
  });

  it("treats an empty string as {} and reports the missing arguments", async () => {
    const message = await call("s-args", { id: "a-empty", name: "strict", arguments: "  " });
    expect(message.error).toMatchObject({
      code: "missing_arguments",
      details: { missing_required: ["name", "count"] },
    });
  });
});

describe("arguments that fail the schema", () => {
  it("names every wrong type with a JSON pointer, nested ones and array items too", async () => {
    const message = await call("s-schema", {
      id: "t1",
      name: "strict",
      arguments: { name: 5, count: "3", flags: [true, "no"], nested: { level: "high" } },
    });
    expect(parameterErrors(message)).toEqual(
      expect.arrayContaining([
        ["/name", "type", "string", 5],
        ["/count", "type", "integer", "3"],
        ["/flags/1", "type", "boolean", "no"],
        ["/nested/level", "type", "integer", "high"],
      ]),
    );
    expect(parameterErrors(message)).toHaveLength(4);
  });

  it("names an enum violation with the allowed values", async () => {
    const message = await call("s-schema", {
      id: "t2",
      name: "strict",
      arguments: { name: "a", count: 1, mode: "medium" },
    });
    expect(parameterErrors(message)).toEqual([["/mode", "enum", ["fast", "slow"], "medium"]]);
  });

  it("names extra properties where the schema forbids them, at the top and nested", async () => {
    const message = await call("s-schema", {
      id: "t3",
      name: "strict",
      arguments: { name: "a", count: 1, extra: 1, nested: { level: 1, sneaky: true } },
    });
    expect(parameterErrors(message)).toEqual(
      expect.arrayContaining([
        ["/extra", "additionalProperties", "extra", 1],
        ["/nested/sneaky", "additionalProperties", "sneaky", true],
      ]),
    );
    expect(parameterErrors(message)).toHaveLength(2);
  });

  it("names bounds, integers and nested required properties", async () => {
    const message = await call("s-schema", {
      id: "t4",
      name: "strict",
      arguments: { name: "", count: 1.5, nested: {} },
    });
    expect(parameterErrors(message)).toEqual(
      expect.arrayContaining([
        ["/name", "minLength", 1, ""],
        ["/count", "type", "integer", 1.5],
        ["/nested/level", "required", "level", undefined],
      ]),
    );
  });
});

describe("__proto__, constructor and prototype keys", () => {
  const hostile =
    '{"__proto__":{"polluted":true},"constructor":{"prototype":{"polluted":true}},' +
    '"prototype":{"polluted":true},' +
    '"opts":{"__proto__":{"polluted":true},"constructor":{"prototype":{"polluted":true}}}}';

  it("passes them to the tool as plain data and pollutes nothing (JSON text)", async () => {
    const body = json(await call("s-proto", { id: "p1", name: "echo_any", arguments: hostile }));
    expect(body.polluted).toBeNull();
    expect(body.plain_prototype).toBe(true);
    expect(body.own_keys).toEqual(expect.arrayContaining(["constructor", "prototype", "opts"]));
    expect(body.nested_keys).toMatchObject({
      constructor: ["prototype"],
      prototype: ["polluted"],
    });
    expect(body.nested_keys).toHaveProperty("opts", expect.arrayContaining(["constructor", "x"]));
    expect(({} as Record<string, unknown>)["polluted"]).toBeUndefined();
  });

  // The resolver validates a top-level `__proto__` key as data, but the executor's envelope
  // parser (a zod record) drops it, so the tool never sees it (reported). Nested ones arrive.
  it("drops a top-level __proto__ key before the tool and keeps nested ones as data", async () => {
    const body = json(await call("s-proto", { id: "p2", name: "echo_any", arguments: hostile }));
    expect(body.own_keys).toEqual(["constructor", "prototype", "opts"]);
    expect(body.nested_keys).toHaveProperty("opts", ["__proto__", "constructor", "x"]);
    expect((body.args as { opts: Record<string, unknown> }).opts).toEqual(
      JSON.parse(
        '{"__proto__":{"polluted":true},"constructor":{"prototype":{"polluted":true}},"x":1}',
      ),
    );
    expect(body.polluted).toBeNull();
  });

  it("passes them to the tool as plain data and pollutes nothing (object form)", async () => {
    const args = JSON.parse(hostile) as Record<string, unknown>;
    const body = json(
      await call(
        "s-proto",
        { id: "p3", name: "echo_any", arguments: args },
        {
          context: JSON.parse('{"__proto__":{"polluted":true},"user":"u"}') as Record<
            string,
            unknown
          >,
        },
      ),
    );
    expect(body.polluted).toBeNull();
    expect(body.plain_prototype).toBe(true);
    expect(body.context_keys).toEqual(expect.arrayContaining(["ledgerDir", "user"]));
    expect(({} as Record<string, unknown>)["polluted"]).toBeUndefined();
  });

  it("refuses them where the schema forbids extra properties", async () => {
    const message = await call("s-proto", {
      id: "p4",
      name: "strict",
      arguments: '{"name":"a","count":1,"__proto__":{"polluted":true},"constructor":{}}',
    });
    expect(parameterErrors(message)).toEqual(
      expect.arrayContaining([
        ["/__proto__", "additionalProperties", "__proto__", { polluted: true }],
        ["/constructor", "additionalProperties", "constructor", {}],
      ]),
    );
  });

  it("leaks nothing into the defaults of later calls", async () => {
    const body = json(await call("s-proto", { id: "p5", name: "echo_any", arguments: {} }));
    expect(body.args).toEqual({ opts: { x: 1 } });
    expect(body.polluted).toBeNull();
  });
});

describe("deep and large arguments", () => {
  const nested = (depth: number): string => `${'{"a":'.repeat(depth)}1${"}".repeat(depth)}`;

  it("resolves and runs arguments nested as deep as allowed", async () => {
    const body = json(
      await call("s-size", { id: "d1", name: "measure", arguments: nested(MAX_ARGUMENT_DEPTH) }),
    );
    expect(body.depth).toBe(MAX_ARGUMENT_DEPTH);
  });

  it("refuses arguments nested 2000 deep in arrays, naming the limit", async () => {
    const args = `{"list":${"[".repeat(2000)}${"]".repeat(2000)}}`;
    const message = await call("s-size", { id: "d2", name: "measure", arguments: args });
    expect(message.error).toMatchObject({
      code: "invalid_arguments",
      details: { max_depth: MAX_ARGUMENT_DEPTH },
    });
  });

  // JSON.parse takes 20 000 levels, but every later JSON.stringify would overflow the stack:
  // the resolver refuses arguments deeper than MAX_ARGUMENT_DEPTH at once.
  it("answers arguments nested 20 000 deep at once with a typed error", async () => {
    const started = Date.now();
    const message = await call("s-size", { id: "d3", name: "measure", arguments: nested(20_000) });
    expect(["invalid_arguments", "payload_too_large"]).toContain(message.error?.code);
    expect(Date.now() - started).toBeLessThan(1_000);
  });

  // The client refuses such an object itself, in the resolver's terms.
  it("answers an object nested 20 000 deep given to the client with a typed error", async () => {
    const message = await call(
      "s-size",
      {
        id: "d4",
        name: "measure",
        arguments: JSON.parse(nested(20_000)) as Record<string, unknown>,
      },
      { timeoutMs: 1_500 },
    );
    expect(["invalid_arguments", "payload_too_large"]).toContain(message.error?.code);
  });

  it("runs ~900 KB of arguments under the size limit", async () => {
    const blob = "x".repeat(900_000);
    const body = json(await call("s-size", { id: "h1", name: "measure", arguments: { blob } }));
    expect(body.bytes).toBe(JSON.stringify({ blob }).length);
  });

  it("answers payload_too_large when filled defaults make the resolved call too large", async () => {
    const message = await call("s-size", {
      id: "h2",
      name: "strict",
      arguments: { name: "x".repeat(900_000), count: 1 },
    });
    expect(message.error).toMatchObject({ code: "payload_too_large", retryable: false });
    expect(message.error?.details).toMatchObject({ subject: subjects.work("strict") });
  });

  it("refuses a call over the server's max_payload in the client", async () => {
    const jsm = await jetstreamManager(nc);
    const before = (await jsm.streams.info(subjects.streams.calls)).state.last_seq;
    const message = await call("s-size", {
      id: "h3",
      name: "measure",
      arguments: { blob: "x".repeat(1_100_000) },
    });
    expect(message.error).toMatchObject({ code: "payload_too_large", retryable: false });
    expect(message.error?.message).toMatch(/max_payload/);
    expect((await jsm.streams.info(subjects.streams.calls)).state.last_seq).toBe(before);
  });

  it("refuses a call over the stream's max_msg_size in the client", async () => {
    const session = smallClient.session("s-small");
    const message = await session.submit({
      id: "h4",
      name: "measure",
      arguments: { blob: "x".repeat(SMALL_MAX_MESSAGE_BYTES) },
    }).result;
    session.close();
    expect(message.error).toMatchObject({ code: "payload_too_large", retryable: false });
    expect(message.error?.message).toMatch(/max_msg_size/);
    const jsm = await jetstreamManager(nc);
    expect((await jsm.streams.info(smallSubjects.streams.calls)).state.messages).toBe(0);
  });
});

describe("an envelope whose arguments object nests 10 000 deep", () => {
  const deep = (depth: number): string => `${'{"a":'.repeat(depth)}1${"}".repeat(depth)}`;

  it.each([
    ["an object", "deep-object", deep(10_000)],
    ["an object inside an array", "deep-in-array", `{"list":[${deep(10_000)}]}`],
  ])(
    "answers %s on the call's own id with invalid_arguments naming the limit",
    async (_, id, args) => {
      const text =
        `{"tool_call":{"id":"${id}","type":"function","function":{"name":"measure",` +
        `"arguments":${args}}},"session_id":"s-deep"}`;
      const { message } = await rawCall("s-deep", new TextEncoder().encode(text), {
        callId: id,
      });
      expect(message).toMatchObject({
        tool_call_id: id,
        name: "measure",
        session_id: "s-deep",
        attempts: 0,
        error: {
          code: "invalid_arguments",
          message: `function.arguments nest deeper than ${MAX_ARGUMENT_DEPTH} levels`,
          retryable: false,
          details: { max_depth: MAX_ARGUMENT_DEPTH },
        },
      });
      // The resolver goes on: the next call of the session runs.
      const ok = await rawCall("s-deep", envelope("s-deep", `after-${id}`, "measure", {}), {
        callId: `after-${id}`,
      });
      expect(ok.message.error).toBeUndefined();
    },
  );
});

describe("execution context nested too deep", () => {
  const nested = (depth: number): string => `${'{"a":'.repeat(depth)}1${"}".repeat(depth)}`;
  /** A call's JSON text with `field` nested `depth` deep (too deep for JSON.stringify). */
  const deepCall = (id: string, field: string, depth: number): Uint8Array =>
    new TextEncoder().encode(
      `{"tool_call":{"id":"${id}","type":"function","function":{"name":"measure",` +
        `"arguments":"{}"}},"session_id":"s-ctx","${field}":${nested(depth)}}`,
    );

  for (const field of ["context", "agent_context"]) {
    it(`answers a call whose ${field} nests 10 000 deep, on the wire, with invalid_request naming it`, async () => {
      const id = `ctx-${field}`;
      const { message } = await rawCall("s-ctx", deepCall(id, field, 10_000), { callId: id });
      expect(message.error).toMatchObject({
        code: "invalid_request",
        message: `${field} nests deeper than ${MAX_ARGUMENT_DEPTH} levels`,
        retryable: false,
        details: { field, max_depth: MAX_ARGUMENT_DEPTH },
      });
    });
  }

  it("runs a call whose context is nested as deep as allowed", async () => {
    const { message } = await rawCall("s-ctx", deepCall("ctx-ok", "context", MAX_ARGUMENT_DEPTH), {
      callId: "ctx-ok",
    });
    expect(message.error).toBeUndefined();
  });

  it("refuses a context nested 10 000 deep in the client, and in its dry run, in the resolver's terms", async () => {
    const context = JSON.parse(nested(10_000)) as Record<string, unknown>;
    const message = await call("s-ctx", { id: "ctx-client", name: "measure" }, { context });
    const expected = {
      code: "invalid_request",
      details: { field: "context", max_depth: MAX_ARGUMENT_DEPTH },
    };
    expect(message.error).toMatchObject(expected);
    const dry = await client.resolve("s-ctx", { id: "ctx-dry", name: "measure" }, { context });
    expect(dry).toMatchObject({ ok: false, error: expected });
  });
});

describe("bodies that are not a call request", () => {
  it("answers invalid UTF-8 with invalid_request on the session, as invalid-<seq>", async () => {
    const bytes = new Uint8Array([0x7b, 0x22, 0xff, 0xfe, 0x22, 0x3a, 0xc3, 0x28, 0x7d]);
    const { ack, message } = await rawCall("s raw.utf8", bytes);
    expect(message).toMatchObject({
      tool_call_id: `invalid-${ack.seq}`,
      name: "",
      // Without a readable body, the session is known only by its token.
      session_id: subjectToken("s raw.utf8"),
      attempts: 0,
      error: { code: "invalid_request", retryable: false },
    });
    expect(message.error?.message).toMatch(/UTF-8/);
  });

  it("answers invalid UTF-8 inside an otherwise valid envelope on the call's own id", async () => {
    const bytes = encodeJson(envelope("s-raw", "u1", "strict", { name: "NAME", count: 1 }));
    const at = Buffer.from(bytes).indexOf("NAME");
    bytes.set([0xed, 0xa0, 0x80, 0x41], at); // an encoded surrogate: not UTF-8
    const { message } = await rawCall("s-raw", bytes, { callId: "u1" });
    expect(message).toMatchObject({
      tool_call_id: "u1",
      name: "strict",
      session_id: "s-raw",
      error: { code: "invalid_request", message: "call request is not valid UTF-8" },
    });
  });

  /** Text the engine's JSON.parse would say about `text`. */
  const engineSays = (text: string): string => {
    try {
      JSON.parse(text);
    } catch (err) {
      return (err as Error).message;
    }
    return "";
  };

  it("answers a body cut short after its id on the call's own id, in the mesh's own words", async () => {
    const text = JSON.stringify(envelope("s-raw", "cut-1", "strict", { name: "a", count: 1 }));
    const cut = text.slice(0, text.indexOf('"count"'));
    const { message } = await rawCall("s-raw", new TextEncoder().encode(cut), { callId: "cut-1" });
    expect(message).toMatchObject({
      tool_call_id: "cut-1",
      name: "strict",
      session_id: "s-raw",
      attempts: 0,
      error: {
        code: "invalid_request",
        retryable: false,
        message: `call request is not JSON (line 1, column ${cut.length + 1}): the text ends before the JSON value does`,
        details: { position: cut.length },
      },
    });
    expect(message.error?.message).not.toContain(engineSays(cut));
  });

  it("answers a body that breaks after arguments nested 10 000 deep on its own id", async () => {
    const deepArgs = `${'{"a":'.repeat(10_000)}1${"}".repeat(10_000)}`;
    const text =
      `{"session_id":"s-raw","tool_call":{"id":"deep-broken","type":"function",` +
      `"function":{"name":"strict","arguments":${deepArgs}}},,}`;
    const started = Date.now();
    const { message } = await rawCall("s-raw", new TextEncoder().encode(text), {
      callId: "deep-broken",
    });
    expect(Date.now() - started).toBeLessThan(5_000);
    expect(message).toMatchObject({
      tool_call_id: "deep-broken",
      name: "strict",
      error: { code: "invalid_request", details: { position: text.length - 2 } },
    });
    expect(message.error?.message).toMatch(/: expected a double-quoted property name, found ","$/);
    expect(message.error?.message).not.toContain(engineSays(text));
  });

  it.each([
    ["not JSON", "not json at all"],
    ["empty", ""],
    ["JSON null", "null"],
    ["a JSON array", "[]"],
    ["a JSON number", "42"],
    ["an object without tool_call", '{"session_id":"s-raw"}'],
  ])("answers a body that is %s with invalid_request as invalid-<seq>", async (_, text) => {
    const { ack, message } = await rawCall("s-raw", new TextEncoder().encode(text));
    expect(message.tool_call_id).toBe(`invalid-${ack.seq}`);
    expect(message.error?.code).toBe("invalid_request");
  });

  it("answers a session_id that does not match the subject on the subject's session", async () => {
    const { message } = await rawCall(
      "s-raw",
      envelope("s-other", "m1", "strict", { name: "a", count: 1 }),
      { callId: "m1" },
    );
    expect(message.error).toMatchObject({
      code: "invalid_request",
      details: { session_id: "s-other" },
    });
  });

  it("answers a call id longer than 256 characters as invalid-<seq>", async () => {
    const { ack, message } = await rawCall(
      "s-raw",
      envelope("s-raw", "i".repeat(257), "strict", { name: "a", count: 1 }),
    );
    expect(message.tool_call_id).toBe(`invalid-${ack.seq}`);
    expect(message.error?.code).toBe("invalid_request");
    expect(message.name).toBe("strict");
  });
});

describe("tool names", () => {
  it.each([
    ["a dot", "no.such.tool"],
    ["a star", "tool*"],
    ["a wildcard tail", "a.>"],
    ["only >", ">"],
    ["only *", "*"],
    ["a space", "my tool"],
    ["empty parts", "a..b"],
    ["only a dot", "."],
    ["a trailing dot", "bad.input.dotted."],
    ["an escape lookalike", "bad=2einput=2edotted"],
    ["non-ASCII letters", "天气"],
  ])("answers a name with %s with unknown_tool", async (_, name) => {
    const message = await call("s-names", { id: `n-${subjectToken(name)}`, name, arguments: {} });
    expect(message.error).toMatchObject({ code: "unknown_tool", details: { tool: name } });
    expect(message.name).toBe(name);
  });

  it("suggests close matches for a near miss of the dotted tool", async () => {
    const message = await call("s-names", { id: "n-near", name: "bad.input.dotte", arguments: {} });
    expect(message.error).toMatchObject({
      code: "unknown_tool",
      details: { close_matches: ["bad.input.dotted"] },
    });
  });

  it.each([
    ["a newline", "strict\n", { position: 6, code_point: 10 }],
    ["a NUL", "str\u0000ict", { position: 3, code_point: 0 }],
    ["DEL", "\u007f", { position: 0, code_point: 127 }],
    ["129 characters", "x".repeat(129), { length: 129, max_length: 128 }],
  ])("answers a name with %s with invalid_request", async (_, name, details) => {
    const message = await call("s-names", {
      id: `n-bad-${subjectToken(name)}`,
      name,
      arguments: {},
    });
    expect(message.error).toMatchObject({ code: "invalid_request", details });
  });

  it.each([
    ["empty", ""],
    ["longer than 4096 characters", "y".repeat(4097)],
  ])("answers a name that is %s with invalid_request from the resolver", async (_, name) => {
    const id = `n-raw-${name.length}`;
    const { message } = await rawCall("s-names", envelope("s-names", id, name, {}), {
      callId: id,
    });
    expect(message.error?.code).toBe("invalid_request");
    expect(message.error?.details?.issues).toEqual([
      expect.objectContaining({ path: "/tool_call/function/name" }),
    ]);
  });

  it("runs the registered tool whose name holds dots", async () => {
    const message = await call("s-names", {
      id: "n-dotted",
      name: "bad.input.dotted",
      arguments: {},
    });
    expect(json(message)).toEqual({ dotted: true, n: 1 });
    const jsm = await jetstreamManager(nc);
    const consumer = await jsm.consumers.info(
      subjects.streams.work,
      subjects.workConsumer("bad.input.dotted"),
    );
    expect(consumer.config.filter_subject).toBe("toolmesh.v1.work.bad=2einput=2edotted");
  });
});

describe("session ids", () => {
  const strange = [
    "s.dot",
    "s*star",
    "s>gt",
    ">",
    "*",
    ".",
    "s..empty",
    "s with spaces",
    "s\ttab\u0001ctl\u007f",
    "a.b",
    "a=2eb",
    "会话-天气",
    "s\u2028line",
    "s".repeat(240),
    "lone\ud800surrogate",
  ];

  it("answers every call on its own session, and no other session sees it", async () => {
    const bystander = new SessionWatch(subjects.address(TENANT, "s-bystander"));
    const sessions = strange.map((id) => client.session(id));
    const messages = await Promise.all(
      sessions.map(
        (session, i) =>
          session.submit({ id: `c.*>${i}`, name: "strict", arguments: { name: "n", count: i } })
            .result,
      ),
    );
    for (const session of sessions) session.close();
    bystander.close();
    messages.forEach((message, i) => {
      expect(message.session_id).toBe(strange[i]);
      expect(json(message)).toEqual({ args: { name: "n", count: i, mode: "fast" } });
    });
    expect(bystander.messages).toEqual([]);
    for (const [i, id] of strange.entries()) {
      const onWire = published.filter((p) => p.message.tool_call_id === `c.*>${i}`);
      expect(onWire.map((p) => p.subject)).toEqual([
        subjects.result(subjects.address(TENANT, id), `c.*>${i}`),
      ]);
    }
  });

  // The default idempotency key `{session_id}/{call_id}` is then longer than one id.
  it("runs a call whose session id is 256 characters long", async () => {
    const message = await call(
      "s".repeat(256),
      { id: "c-256", name: "strict", arguments: { name: "n", count: 1 } },
      { timeoutMs: 2_000 },
    );
    expect(message.error).toBeUndefined();
  });

  it("refuses a session id longer than 256 characters in the client", async () => {
    const message = await call("s".repeat(300), {
      id: "long",
      name: "strict",
      arguments: { name: "n", count: 1 },
    });
    expect(message.error?.code).toBe("invalid_request");
    expect(message.error?.details?.issues).toEqual([
      expect.objectContaining({ path: "/session_id" }),
    ]);
  });

  it("answers a raw call whose session id is longer than 256 characters", async () => {
    const id = "s".repeat(300);
    const { message } = await rawCall(id, envelope(id, "long-raw", "strict", {}), {
      callId: "long-raw",
    });
    expect(message.error?.code).toBe("invalid_request");
    expect(message.error?.details?.issues).toEqual([
      expect.objectContaining({ path: "/session_id" }),
    ]);
  });

  it("refuses an empty session id when the session is opened", () => {
    expect(() => client.session("")).toThrow(/must not be empty/);
  });
});

describe("timeout_ms", () => {
  it.each([0, -5, 1.5, "1000", 1e20])(
    "answers a raw call with timeout_ms %j with invalid_request",
    async (timeout) => {
      const id = `to-${String(timeout)}`;
      const { message } = await rawCall(
        "s-timeout",
        envelope("s-timeout", id, "measure", {}, { timeout_ms: timeout }),
        { callId: id },
      );
      expect(message.error?.code).toBe("invalid_request");
      expect(message.error?.details?.issues).toEqual([
        expect.objectContaining({ path: "/timeout_ms" }),
      ]);
    },
  );

  it.each([0, -5])("refuses timeoutMs %d in the client", async (timeoutMs) => {
    const message = await call(
      "s-timeout",
      { id: `to-local-${timeoutMs}`, name: "measure", arguments: {} },
      { timeoutMs },
    );
    expect(message.error?.code).toBe("invalid_request");
  });

  it("answers a 1 ms budget with deadline_exceeded", async () => {
    const message = await call(
      "s-timeout",
      { id: "to-1ms", name: "measure", arguments: {} },
      { timeoutMs: 1 },
    );
    expect(message.error?.code).toBe("deadline_exceeded");
  });

  it("refuses a raw call whose timeout_ms outlives the call records", async () => {
    const { message } = await rawCall(
      "s-timeout",
      envelope("s-timeout", "to-max", "measure", {}, { timeout_ms: Number.MAX_SAFE_INTEGER }),
      { callId: "to-max" },
    );
    expect(message.error).toMatchObject({
      code: "invalid_request",
      details: { timeout_ms: Number.MAX_SAFE_INTEGER, max_timeout_ms: 2 ** 32 },
    });
  });

  it("runs a call whose budget is longer than a timer can hold", async () => {
    const watch = new SessionWatch(subjects.address(TENANT, "s-timeout-long"));
    const session = client.session("s-timeout-long");
    void session.submit({ id: "to-long", name: "measure", arguments: {} }, { timeoutMs: 2 ** 31 });
    const message = await watch.result("to-long");
    session.close();
    watch.close();
    expect(json(message)).toEqual({ bytes: 2, depth: 1 });
  });

  // Node timers hold at most 2^31 - 1 ms: the client caps its own wait there.
  it("waits in the client for a call whose budget is longer than a timer can hold", async () => {
    const message = await call(
      "s-timeout",
      { id: "to-long-client", name: "measure", arguments: {} },
      { timeoutMs: 2 ** 31 },
    );
    expect(message.error).toBeUndefined();
  });
});

/** How many times the ledger tool ran for a handler's idempotency key. */
async function executions(key: string): Promise<number> {
  const text = await readFile(join(ledgerDir, "executions.log"), "utf8").catch(() => "");
  return text.split("\n").filter((line) => line === JSON.stringify(key)).length;
}

describe("duplicate call ids", () => {
  it("runs a call resubmitted with the same id and arguments once", async () => {
    const first = await call("s-dup", { id: "dup-1", name: "ledger", arguments: { value: "v" } });
    const second = await call("s-dup", { id: "dup-1", name: "ledger", arguments: { value: "v" } });
    expect(json(first)).toEqual({ key: "default/s-dup/s-dup/dup-1", count: 1, value: "v" });
    expect(json(second)).toEqual({ key: "default/s-dup/s-dup/dup-1", count: 1, value: "v" });
    expect(await executions("default/s-dup/s-dup/dup-1")).toBe(1);
  });

  it("runs a call submitted twice at once with the same id once", async () => {
    const a = client.session("s-dup");
    const b = client.session("s-dup");
    const input = { id: "dup-2", name: "ledger", arguments: { value: "w" } };
    const [first, second] = await Promise.all([a.submit(input).result, b.submit(input).result]);
    a.close();
    b.close();
    expect(json(first)).toEqual({ key: "default/s-dup/s-dup/dup-2", count: 1, value: "w" });
    expect(json(second)).toEqual(json(first));
    expect(await executions("default/s-dup/s-dup/dup-2")).toBe(1);
  });

  it("refuses the same id with different arguments with idempotency_conflict", async () => {
    const first = await call("s-dup", { id: "dup-3", name: "ledger", arguments: { value: "a" } });
    const second = await call("s-dup", { id: "dup-3", name: "ledger", arguments: { value: "b" } });
    expect(json(first)).toMatchObject({ count: 1, value: "a" });
    expect(second.error).toMatchObject({
      code: "idempotency_conflict",
      details: { idempotency_key: "s-dup/dup-3" },
    });
    expect(await executions("default/s-dup/s-dup/dup-3")).toBe(1);
  });

  it("answers raw resubmissions from the record, and a conflict only on the submission's own subject", async () => {
    const address = subjects.address(TENANT, "s-dup");
    const watch = new SessionWatch(address);
    try {
      const same = await rawCall("s-dup", envelope("s-dup", "dup-1", "ledger", { value: "v" }), {
        callId: "dup-1",
      });
      expect(json(same.message)).toEqual({
        key: "default/s-dup/s-dup/dup-1",
        count: 1,
        value: "v",
      });
      const ack = await js.publish(
        subjects.call(address),
        encodeJson(envelope("s-dup", "dup-1", "ledger", { value: "changed" })),
        { msgID: randomUUID() },
      );
      const rejection = await watch.rejection(ack.seq);
      expect(rejection).toMatchObject({
        tool_call_id: "dup-1",
        seq: ack.seq,
        attempts: 0,
        error: { code: "idempotency_conflict", details: { idempotency_key: "s-dup/dup-1" } },
      });
      // The call's own subject holds only its real result, live and in the stream.
      expect(watch.messages.map((m) => m.message.error?.code)).not.toContain(
        "idempotency_conflict",
      );
      const jsm = await jetstreamManager(nc);
      const stored = present(
        await jsm.streams.getMessage(subjects.streams.sessions, {
          last_by_subj: subjects.result(address, "dup-1"),
        }),
        "the stored result",
      );
      expect(json(stored.json<ToolMessage>())).toMatchObject({ count: 1, value: "v" });
      expect(await executions("default/s-dup/s-dup/dup-1")).toBe(1);
    } finally {
      watch.close();
    }
  });
});

describe("call identity: keys, conflicts, cancellation, tenants", () => {
  /** Publishes a call as a foreign frontend would (a fresh random message id). */
  async function publishRaw(
    tenant: string,
    sessionId: string,
    body: Record<string, unknown>,
  ): Promise<PubAck> {
    return js.publish(subjects.call(subjects.address(tenant, sessionId)), encodeJson(body), {
      msgID: randomUUID(),
    });
  }

  /** Resolves once the call has started (its first progress event). */
  function started(address: SessionAddress, callId: string): Promise<void> {
    return new Promise((resolve) => {
      const sub = nc.subscribe(subjects.progress(address, callId), {
        callback: () => {
          sub.unsubscribe();
          resolve();
        },
      });
    });
  }

  async function cancelRaw(
    tenant: string,
    sessionId: string,
    body: Record<string, unknown>,
  ): Promise<Record<string, unknown>> {
    const reply = await nc.request(
      subjects.cancel(subjects.address(tenant, sessionId)),
      encodeJson(body),
      { timeout: 5_000 },
    );
    return reply.json();
  }

  it("answers the same idempotency key under a new call id with the ended call's result", async () => {
    const session = client.session("s-newid");
    const key = "order-17";
    const first = await session.submit(
      { id: "n1", name: "ledger", arguments: { value: "x" } },
      { idempotencyKey: key },
    ).result;
    const second = await session.submit(
      { id: "n2", name: "ledger", arguments: { value: "x" } },
      { idempotencyKey: key },
    ).result;
    session.close();
    expect(second).toEqual({ ...first, tool_call_id: "n2" });
    // The same through the wire, as another frontend would send it.
    const { message } = await rawCall(
      "s-newid",
      envelope("s-newid", "n3", "ledger", { value: "x" }, { idempotency_key: key }),
      { callId: "n3" },
    );
    expect(message).toEqual({ ...first, tool_call_id: "n3" });
    expect(await executions("default/s-newid/order-17")).toBe(1);
  });

  it("keeps the first call's result when the same id comes back with other arguments while it runs", async () => {
    const address = subjects.address(TENANT, "s-clash");
    const watch = new SessionWatch(address);
    try {
      const running = started(address, "k1");
      const args = (value: string) => ({ ms: 300, value, storage: {} });
      await publishRaw(TENANT, "s-clash", envelope("s-clash", "k1", "slow", args("one")));
      await running;
      const clash = await publishRaw(
        TENANT,
        "s-clash",
        envelope("s-clash", "k1", "slow", args("two")),
      );
      expect((await watch.rejection(clash.seq)).error.code).toBe("idempotency_conflict");
      const result = await watch.result("k1");
      expect(json(result)).toMatchObject({ value: "one" });
      expect(watch.messages).toHaveLength(1);
      // A third submission with the first arguments is answered with the real result, from
      // the stream after a duplicate PubAck too (the client's path).
      const session = client.session("s-clash");
      const again = await session.submit({ id: "k1", name: "slow", arguments: args("one") }).result;
      session.close();
      expect(again).toEqual(result);
    } finally {
      watch.close();
    }
  });

  it("names the arguments a final message answers, so a reused call id is not settled by another's result", async () => {
    const address = subjects.address(TENANT, "s-reuse");
    const args = (value: string) => ({ ms: 400, value, storage: {} });
    // The owner's result, as the mesh stores it, for the same call id and other arguments.
    const foreign: ToolMessage = {
      role: "tool",
      tool_call_id: "r1",
      name: "slow",
      content: '{"value":"owner"}',
      session_id: "s-reuse",
      args_hash: argumentsHash(args("owner")),
    };
    await js.publish(subjects.result(address, "r1"), encodeJson(foreign));
    const session = client.session("s-reuse");
    try {
      const handle = session.submit({ id: "r1", name: "slow", arguments: args("mine") });
      // Catch-up finds the stored foreign result first; live, another one goes by.
      session.catchUp();
      await js.publish(subjects.result(address, "r1"), encodeJson(foreign));
      const message = await handle.result;
      expect(json(message)).toMatchObject({ value: "mine" });
      expect(message.args_hash).toBe(argumentsHash(args("mine")));
    } finally {
      session.close();
    }
  });

  it("answers a new call id under a key still in flight with idempotency_in_flight", async () => {
    const address = subjects.address(TENANT, "s-inflight");
    const watch = new SessionWatch(address);
    const session = client.session("s-inflight");
    try {
      const running = started(address, "o1");
      const args = { ms: 500, value: "v", storage: {} };
      await publishRaw(
        TENANT,
        "s-inflight",
        envelope("s-inflight", "o1", "slow", args, { idempotency_key: "job-9" }),
      );
      await running;
      const second = await session.submit(
        { id: "o2", name: "slow", arguments: args },
        { idempotencyKey: "job-9" },
      ).result;
      expect(second).toMatchObject({
        tool_call_id: "o2",
        error: {
          code: "idempotency_in_flight",
          retryable: true,
          details: { idempotency_key: "job-9", call_id: "o1", tool: "slow" },
        },
      });
      expect(typeof second.error?.details?.deadline_at).toBe("number");
      const owner = await watch.result("o1");
      expect(json(owner)).toMatchObject({ value: "v" });
      expect(watch.messages.map((m) => m.message.tool_call_id)).toEqual(["o1"]);
      // Once the call ended, the same submission is answered with its stored final message.
      const again = await session.submit(
        { id: "o2", name: "slow", arguments: args },
        { idempotencyKey: "job-9" },
      ).result;
      expect(again).toEqual({ ...owner, tool_call_id: "o2" });
    } finally {
      session.close();
      watch.close();
    }
  });

  it("answers a refused resubmission of an ended call from its record, not with the refusal", async () => {
    const first = await rawCall(
      "s-refused",
      envelope("s-refused", "f1", "ledger", { value: "r" }),
      {
        callId: "f1",
      },
    );
    // The same call again, now with a budget longer than records are kept, and with arguments
    // the tool would refuse: neither refusal takes the place of the call's result.
    const tooLong = await rawCall(
      "s-refused",
      envelope("s-refused", "f1", "ledger", { value: "r" }, { timeout_ms: 2 ** 33 }),
      { callId: "f1" },
    );
    expect(tooLong.message).toEqual(first.message);
    const address = subjects.address(TENANT, "s-refused");
    const watch = new SessionWatch(address);
    try {
      const ack = await publishRaw(
        TENANT,
        "s-refused",
        envelope("s-refused", "f1", "ledger", { value: 5 }),
      );
      expect((await watch.rejection(ack.seq)).error.code).toBe("idempotency_conflict");
      expect(watch.messages).toEqual([]);
    } finally {
      watch.close();
    }
  });

  it("answers a malformed cancel with invalid_request, not retryable, naming what was wrong", async () => {
    const address = subjects.address(TENANT, "s-cancel-bad");
    const notJson = await nc.request(subjects.cancel(address), "{not json", { timeout: 5_000 });
    expect(notJson.json()).toEqual({
      cancelled: false,
      state: "unknown",
      error: { code: "invalid_request", message: "cancel request is not JSON", retryable: false },
    });
    const noId = await cancelRaw(TENANT, "s-cancel-bad", { session_id: "s-cancel-bad" });
    expect(noId).toMatchObject({
      cancelled: false,
      state: "unknown",
      error: {
        code: "invalid_request",
        retryable: false,
        details: { issues: [{ path: "/tool_call_id", message: expect.any(String) }] },
      },
    });
  });

  it("cancels the corrected resubmission of a refused call after a pending cancel, as documented", async () => {
    const session = client.session("s-pending");
    try {
      const refused = await session.submit({ id: "p1", name: "strict", arguments: { count: 1 } })
        .result;
      expect(refused.error?.code).toBe("missing_arguments");
      expect(await session.cancel("p1")).toMatchObject({ cancelled: false, state: "pending" });
      const corrected = await session.submit({
        id: "p1",
        name: "strict",
        arguments: { name: "n", count: 1 },
      }).result;
      expect(corrected.error?.code).toBe("cancelled");
      const fresh = await session.submit({
        id: "p2",
        name: "strict",
        arguments: { name: "n", count: 1 },
      }).result;
      expect(fresh.error).toBeUndefined();
    } finally {
      session.close();
    }
  });

  it("does not answer cancelled for a call it does not know, nor for one named without its key", async () => {
    const unknown = await cancelRaw(TENANT, "s-cancel", {
      tool_call_id: "never-sent",
      session_id: "s-cancel",
    });
    expect(unknown).toEqual({
      cancelled: false,
      state: "pending",
      idempotency_key: "s-cancel/never-sent",
    });
    const address = subjects.address(TENANT, "s-cancel");
    const watch = new SessionWatch(address);
    try {
      const running = started(address, "own-1");
      await publishRaw(
        TENANT,
        "s-cancel",
        envelope(
          "s-cancel",
          "own-1",
          "slow",
          { ms: 300, storage: {} },
          { idempotency_key: "mine" },
        ),
      );
      await running;
      // The call set its own key; a cancel that does not name it names another call.
      const reply = await cancelRaw(TENANT, "s-cancel", {
        tool_call_id: "own-1",
        session_id: "s-cancel",
      });
      expect(reply).toMatchObject({ cancelled: false, state: "pending" });
      expect(json(await watch.result("own-1"))).toMatchObject({ key: "default/s-cancel/mine" });
      const named = await cancelRaw(TENANT, "s-cancel", {
        tool_call_id: "own-1",
        session_id: "s-cancel",
        idempotency_key: "mine",
      });
      expect(named).toEqual({ cancelled: false, state: "done", idempotency_key: "mine" });
    } finally {
      watch.close();
    }
  });

  it("scopes keys by session: a cancel naming another session's key leaves that call alone", async () => {
    const victim = subjects.address(TENANT, "s-victim");
    const watch = new SessionWatch(victim);
    try {
      const running = started(victim, "v1");
      await publishRaw(
        TENANT,
        "s-victim",
        envelope("s-victim", "v1", "slow", { ms: 300, storage: {} }),
      );
      await running;
      const reply = await cancelRaw(TENANT, "s-attacker", {
        tool_call_id: "v1",
        session_id: "s-attacker",
        idempotency_key: "s-victim/v1",
      });
      expect(reply).toMatchObject({ cancelled: false, state: "pending" });
      const result = await watch.result("v1");
      expect(result).toMatchObject({ tool_call_id: "v1", session_id: "s-victim" });
      expect(result.error).toBeUndefined();
      expect(watch.messages).toHaveLength(1);
    } finally {
      watch.close();
    }
  });

  it("scopes keys by tenant: another tenant's ids run as its own call, never read or conflict", async () => {
    const owner = await rawCall("s-shared", envelope("s-shared", "t1", "ledger", { value: "a" }), {
      callId: "t1",
    });
    expect(json(owner.message)).toEqual({
      key: "default/s-shared/s-shared/t1",
      count: 1,
      value: "a",
    });
    const sameArgs = await rawCall(
      "s-shared",
      envelope("s-shared", "t1", "ledger", { value: "a" }),
      { callId: "t1", tenant: "other" },
    );
    expect(json(sameArgs.message)).toEqual({
      key: "other/s-shared/s-shared/t1",
      count: 1,
      value: "a",
    });
    const otherArgs = await rawCall(
      "s-shared",
      envelope("s-shared", "t2", "ledger", { value: "b" }, { idempotency_key: "s-shared/t1" }),
      { callId: "t2", tenant: "third" },
    );
    expect(json(otherArgs.message)).toMatchObject({ count: 1, value: "b" });
    const cancel = await cancelRaw("other", "s-shared", {
      tool_call_id: "t9",
      session_id: "s-shared",
      idempotency_key: "s-shared/t1",
    });
    // Its own call, ended: nothing of the owner's.
    expect(cancel).toEqual({ cancelled: false, state: "done", idempotency_key: "s-shared/t1" });
    expect(await executions("default/s-shared/s-shared/t1")).toBe(1);
  });

  it("hides system params from the model and drops values a model gave for them", async () => {
    const missing = await client.resolve("s-system", { name: "slow", arguments: { value: "v" } });
    expect(missing.ok).toBe(false);
    const details = !missing.ok ? missing.error.details : undefined;
    expect(details).toMatchObject({ missing_required: ["ms"] });
    const parameters = details?.parameters as { properties: object; required: string[] };
    expect(Object.keys(parameters.properties)).toEqual(["ms", "value"]);
    expect(parameters.required).toEqual(["ms"]);
    const { message } = await rawCall(
      "s-system",
      envelope("s-system", "sys-1", "slow", { ms: 1, executor: { host: "evil" }, storage: {} }),
      { callId: "sys-1" },
    );
    expect(json(message)).toMatchObject({ arg_names: ["ms"] });
  });

  it("refuses tokens taken from a subject that no id maps to, without answering on a wildcard", async () => {
    const jsm = await jetstreamManager(nc);
    const wildcard = `${subjects.prefix}.v1.calls.${TENANT}.*`;
    const stray = nc.subscribe(`${subjects.prefix}.v1.sessions.${TENANT}.*.>`);
    const seen: string[] = [];
    void (async () => {
      for await (const m of stray) if (m.subject.includes("*")) seen.push(m.subject);
    })();
    const ack = await js.publish(
      wildcard,
      encodeJson(envelope("*", "w1", "ledger", { value: "w" })),
      { msgID: randomUUID() },
    );
    // Dead-lettered, not answered: its session subject would be a wildcard.
    for (;;) {
      const letter = await jsm.streams
        .getMessage(subjects.streams.dlq, { last_by_subj: subjects.dlq("ledger") })
        .catch(() => null);
      if (letter?.header.get("Toolmesh-Dlq-Sequence") === String(ack.seq)) {
        expect(letter.header.get("Toolmesh-Dlq-Subject")).toBe(wildcard);
        expect(letter.header.get("Toolmesh-Dlq-Reason")).toBe("not a call subject");
        break;
      }
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    const cancel = await nc.request(
      `${subjects.prefix}.v1.cancel.${TENANT}.*`,
      encodeJson({ tool_call_id: "w1", session_id: "*" }),
      { timeout: 5_000 },
    );
    expect(cancel.json()).toMatchObject({
      cancelled: false,
      state: "unknown",
      error: { code: "invalid_request" },
    });
    const dryRun = await nc.request(
      `${subjects.prefix}.v1.rpc.>.resolve`.replace(">", "*"),
      encodeJson(envelope("s", "w2", "ledger", {})),
      { timeout: 5_000 },
    );
    expect(dryRun.json()).toMatchObject({ ok: false, error: { code: "invalid_request" } });
    await nc.flush();
    stray.unsubscribe();
    expect(seen).toEqual([]);
  });
});

describe("patterns that backtrack catastrophically", () => {
  it("answers a hostile string at once", async () => {
    const started = Date.now();
    const message = await call("s-evil", {
      id: "e1",
      name: "evil_pattern",
      arguments: { word: `${"a".repeat(30)}!` },
    });
    expect(Date.now() - started).toBeLessThan(2_000);
    expect(parameterErrors(message)).toEqual([
      ["/word", "pattern", "^(a+)+$", `${"a".repeat(30)}!`],
    ]);
  });

  it("answers a hostile property name at once", async () => {
    const started = Date.now();
    const name = `${"a".repeat(40)}!`;
    const message = await call("s-evil", {
      id: "e2",
      name: "evil_pattern",
      arguments: { word: "aaa", tags: { [name]: 1 } },
    });
    expect(Date.now() - started).toBeLessThan(2_000);
    expect(parameterErrors(message)).toEqual([[`/tags/${name}`, "additionalProperties", name, 1]]);
  });

  it("still accepts what the pattern allows", async () => {
    const message = await call("s-evil", {
      id: "e3",
      name: "evil_pattern",
      arguments: { word: "a".repeat(5_000), tags: { aaaa: 2 } },
    });
    expect(json(message)).toEqual({ ok: true, length: 5_000 });
  });

  it("refuses a tool whose pattern needs backtracking at registration", async () => {
    const failed = await startService("executor", {
      ...env,
      TOOLMESH_TOOLS_DIR: join(fixtureTools("tools-bad"), "refused"),
      TOOLMESH_EXECUTOR_OWNER: "refused",
    }).then(
      () => undefined,
      (err: unknown) => err as Error,
    );
    expect(failed?.message).toMatch(/exited with 1/);
    expect(failed?.message).toContain('tool "backref_pattern"');
    expect(failed?.message).toContain(JSON.stringify("^(a+)\\1$"));
    const message = await call("s-evil", { id: "e4", name: "backref_pattern", arguments: {} });
    expect(message.error?.code).toBe("unknown_tool");
  });
});

describe("afterwards", () => {
  it("leaves no call or work message waiting: no queue was poisoned", async () => {
    const jsm = await jetstreamManager(nc);
    // Executors acknowledge just after they publish a result: give the last acks a moment.
    const waiting = async (): Promise<{ calls: number; work: number }> => ({
      calls: (await jsm.streams.info(subjects.streams.calls)).state.messages,
      work: (await jsm.streams.info(subjects.streams.work)).state.messages,
    });
    const until = Date.now() + 5_000;
    let left = await waiting();
    while ((left.calls > 0 || left.work > 0) && Date.now() < until) {
      await new Promise((resolve) => setTimeout(resolve, 50));
      left = await waiting();
    }
    expect(left).toEqual({ calls: 0, work: 0 });
    const consumer = await jsm.consumers.info(subjects.streams.calls, subjects.resolverConsumer);
    expect([consumer.num_pending, consumer.num_ack_pending]).toEqual([0, 0]);
  });

  it("published every successful result on its own session's subject", () => {
    const results = published.filter((p) => p.message.error === undefined);
    expect(results.length).toBeGreaterThan(40);
    for (const { subject, message } of results) {
      // The call-identity cases also call as the tenants `other` and `third`.
      const tenant = subjects.parseResultSubject(subject)?.address.tenant ?? "";
      expect([TENANT, "other", "third"]).toContain(tenant);
      expect(subject).toBe(
        subjects.result(subjects.address(tenant, message.session_id), message.tool_call_id),
      );
    }
  });
});
