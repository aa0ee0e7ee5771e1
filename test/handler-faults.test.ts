// Every request handler of every service, made to fail the way a bug fails (a TypeError thrown
// from inside, a promise rejected with a plain Error), against a real server: the request is
// answered `internal`, the failure is logged, and the service goes on answering. The services
// run in this process, so a failure that escaped would end the test run as an unhandled error.
// The executor and the gateway serve no NATS request-reply of their own.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { EMPTY_CATALOG_CONFIG, StateStore } from "@toolmesh/catalog";
import { ToolmeshClient } from "@toolmesh/client";
import type { Subjects } from "@toolmesh/protocol";
import { ErrorCode, createSubjects, decodeJson, encodeJson } from "@toolmesh/protocol";
import { ToolRegistry } from "@toolmesh/registry";
import type { Resolver } from "@toolmesh/resolver";
import { startResolver } from "@toolmesh/resolver";
import type { SchemaExpander } from "@toolmesh/schema-expander";
import { startSchemaExpander } from "@toolmesh/schema-expander";
import { createLogger, initTelemetry } from "@toolmesh/telemetry";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";

const real = createSubjects({ prefix: "flt" });
/** The logged failures: each answered `internal` must be logged. */
const logged: Record<string, unknown>[] = [];
const log = createLogger({
  service: "test",
  level: "error",
  destination: {
    write: (line: string) => logged.push(JSON.parse(line) as Record<string, unknown>),
  },
});

/**
 * How the next request naming `boom` fails: a TypeError thrown, or a plain Error — rejected by
 * the promise of an async method, thrown by a sync one.
 */
let fault: "throw" | "reject" = "throw";

/**
 * `target` with its `sync` and `async` methods failing when their first argument (a string, or
 * an object's `name`) holds `boom`.
 */
function failing<T extends object>(
  target: T,
  methods: { sync?: readonly string[]; async?: readonly string[] },
): T {
  return new Proxy(target, {
    get(t, prop) {
      const value: unknown = Reflect.get(t, prop, t);
      if (typeof value !== "function") return value;
      const bound = (value as (...args: unknown[]) => unknown).bind(t);
      const async = methods.async?.includes(String(prop)) === true;
      if (!async && methods.sync?.includes(String(prop)) !== true) return bound;
      return (...args: unknown[]) => {
        const first = args[0] as { name?: unknown } | string | undefined;
        const named = typeof first === "string" ? first : first?.name;
        if (typeof named !== "string" || !named.includes("boom")) return bound(...args);
        if (fault === "throw") throw new TypeError("x.y is not a function");
        if (async) return Promise.reject(new Error("a bug rejected"));
        throw new Error("a bug rejected");
      };
    },
  });
}

let server: NatsServerHandle;
let nc: NatsConnection;
let registry: ToolRegistry;
let resolver: Resolver;
let expander: SchemaExpander;
let client: ToolmeshClient;

beforeAll(async () => {
  server = await startNatsServer();
  nc = await connect({ servers: server.url });
  const tracer = initTelemetry({ serviceName: "test", env: {} }).tracer;
  registry = await ToolRegistry.open(nc, { subjects: real, log });
  await registry.register({
    name: "echo",
    summary: "Echoes.",
    kind: "builtin",
    owner: "test",
    parameters: { type: "object", properties: { text: { type: "string" } } },
  });
  // The registry fails for tools named boom; subjects fail to parse a subject naming boom.
  const faultyRegistry = failing(registry, { sync: ["get"], async: ["register", "unregister"] });
  const faultySubjects: Subjects = failing(real, {
    sync: ["parseSessionSubject", "parseRpcTenant", "parseOwnerSubject"],
  });
  resolver = await startResolver({
    nc,
    subjects: faultySubjects,
    registry: faultyRegistry,
    log,
    tracer,
  });
  const store = await StateStore.open(nc, { subjects: real });
  expander = await startSchemaExpander({
    nc,
    subjects: faultySubjects,
    registry: faultyRegistry,
    store,
    catalog: EMPTY_CATALOG_CONFIG,
    log,
    tracer,
  });
  client = new ToolmeshClient(nc, { prefix: "flt", defaultTimeoutMs: 10_000 });
}, 60_000);

afterAll(async () => {
  await expander?.stop(1_000);
  await resolver?.stop(1_000);
  registry?.close();
  await nc?.close();
  await server?.stop();
});

/** The reply of a request, decoded. */
async function ask(subject: string, body: unknown): Promise<Record<string, unknown>> {
  const reply = await nc.request(subject, encodeJson(body), { timeout: 5_000 });
  return decodeJson(reply.data) as Record<string, unknown>;
}

/** Asks with each kind of fault: answered `internal`, logged, and the service goes on. */
async function failsInternally(
  requests: { subject: string; body: unknown }[],
  stillAnswers: () => Promise<void>,
): Promise<void> {
  for (const kind of ["throw", "reject"] as const) {
    fault = kind;
    for (const { subject, body } of requests) {
      const before = logged.length;
      const reply = await ask(subject, body);
      expect(reply, `${kind} on ${subject}`).toMatchObject({
        error: { code: ErrorCode.Internal, retryable: true },
      });
      expect(logged.slice(before).map((l) => l.subject)).toContain(subject);
    }
    await stillAnswers();
  }
}

describe("a failing request handler", () => {
  it("of the resolver's dry runs is answered internal; the resolver goes on", async () => {
    await failsInternally(
      [
        // Fails inside the handler (the registry), and in its scope hook (the subject).
        {
          subject: real.resolveRpc("acme"),
          body: {
            session_id: "s",
            tool_call: { id: "c1", type: "function", function: { name: "boom", arguments: "{}" } },
          },
        },
        { subject: real.resolveRpc("boom"), body: {} },
      ],
      async () => {
        const reply = await client.resolve("s", { name: "echo", arguments: { text: "hi" } });
        expect(reply).toMatchObject({ ok: true });
      },
    );
  });

  it("of the cancel service is answered internal; cancellations go on", async () => {
    await failsInternally(
      [{ subject: `flt.v1.cancel.acme.boom`, body: { tool_call_id: "c", session_id: "boom" } }],
      async () => {
        const reply = await client.session("s").cancel("never-submitted");
        expect(reply.error).toBeUndefined();
      },
    );
  });

  it("of the owner services is answered internal; owners are served on", async () => {
    const definition = {
      name: "acme.boom",
      summary: "Fails.",
      kind: "builtin",
      parameters: { type: "object", properties: {} },
    };
    await failsInternally(
      [
        { subject: real.ownerRegister("acme", "acme.boom"), body: { definition } },
        { subject: real.ownerService("acme", "unregister"), body: { name: "acme.boom" } },
        { subject: real.ownerService("boom", "record"), body: {} },
      ],
      async () => {
        expect(await ask(real.ownerService("acme", "unregister"), { name: "acme.x" })).toEqual({
          removed: false,
        });
      },
    );
  });

  it("of the schema expander is answered internal; catalogs and schemas go on", async () => {
    await failsInternally(
      [
        { subject: real.describeRpc("acme"), body: { session_id: "s", tools: ["boom"] } },
        { subject: real.expandRpc("acme"), body: { session_id: "s", tool: "boom" } },
        { subject: real.catalogRpc("boom"), body: {} },
        { subject: real.groupsRpc("boom"), body: {} },
      ],
      async () => {
        const catalog = await client.catalog();
        expect(catalog.tools.map((t) => t.name)).toEqual(["echo"]);
        const described = await client.session("s").describe(["echo"]);
        expect(described.schemas.map((s) => s.tool)).toEqual(["echo"]);
      },
    );
  });
});
