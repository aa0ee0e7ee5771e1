import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import type { JetStreamApiError, JetStreamManager } from "@nats-io/jetstream";
import { AckPolicy, DeliverPolicy, jetstream, jetstreamManager } from "@nats-io/jetstream";
import { StateStore } from "@toolmesh/catalog";
import { JsApiCode } from "@toolmesh/nats";
import { ToolmeshClient } from "@toolmesh/client";
import type { Session } from "@toolmesh/client";
import type { SchemaEvent, ToolMessage } from "@toolmesh/protocol";
import { ToolmeshError, createSubjects } from "@toolmesh/protocol";
import { ToolRegistry } from "@toolmesh/registry";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { runCli } from "./helpers/cli.js";
import { until } from "./helpers/eventually.js";
import { fixtureTools, killAllServices, startService, toolAvailable } from "./helpers/mesh.js";
import type { ServiceProcess } from "./helpers/mesh.js";

// Schema expansion end to end: a resolver, an executor and two schema expanders, each its own process,
// against a nats-server of this file's own.

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
const CONFIGS = join(ROOT, "test", "fixtures", "configs-schema");
const TOOLS = ["geo.lookup", "note", "purge", "ping"];
const subjects = createSubjects();

let server: NatsServerHandle;
let nc: NatsConnection;
let jsm: JetStreamManager;
let client: ToolmeshClient;
let store: StateStore;
let resolver: ServiceProcess;
let expanders: ServiceProcess[];
let env: Record<string, string>;
let ids = 0;

/** Waits until the process's registry holds the tools (it logs each one, or lists them at start). */
async function sees(service: ServiceProcess, name: string, revision?: number): Promise<void> {
  await service.waitForLog(
    (l) =>
      (l.msg === "tool available" &&
        l.tool === name &&
        (revision === undefined || l.revision === revision)) ||
      (revision === undefined &&
        typeof l.msg === "string" &&
        l.msg.endsWith(" started") &&
        Array.isArray(l.tools) &&
        (l.tools as string[]).includes(name)),
  );
}

async function startExpander(): Promise<ServiceProcess> {
  const expander = await startService("schema-expander", env);
  await Promise.all(TOOLS.map((tool) => sees(expander, tool)));
  return expander;
}

/** The schema events a session receives, as they arrive. */
function schemaEvents(session: Session): SchemaEvent[] {
  const events: SchemaEvent[] = [];
  session.onEvent((event) => {
    if (event.type === "schema" && event.schema !== undefined) events.push(event.schema);
  });
  return events;
}

function call(
  session: Session,
  name: string,
  args: Record<string, unknown>,
  agent?: string,
): Promise<ToolMessage> {
  return session.submit(
    { id: `c${ids++}`, name, arguments: args },
    agent === undefined ? {} : { agent },
  ).result;
}

/**
 * Waits until the resolver's copy of the group switches (kept current by a KV watch, so a switch
 * applies shortly after it is written) answers a dry run of the call with `code`, or accepts it
 * when `code` is undefined.
 */
async function resolverSees(
  sessionId: string,
  name: string,
  args: Record<string, unknown>,
  code: string | undefined,
): Promise<void> {
  await vi.waitFor(
    async () => {
      const reply = await client.resolve(sessionId, { id: "probe", name, arguments: args });
      expect(reply.ok ? undefined : reply.error.code).toBe(code);
    },
    { timeout: 5_000, interval: 20 },
  );
}

/**
 * Readiness: resolves once the expanders' consumer has nothing left to deliver or to be
 * acknowledged, i.e. every missing-arguments event published so far has been handled.
 */
async function expandersDone(): Promise<void> {
  const limit = Date.now() + 15_000;
  for (;;) {
    const info = await jsm.consumers.info(subjects.streams.events, subjects.schemaExpanderConsumer);
    const stream = await jsm.streams.info(subjects.streams.events);
    if (
      info.num_pending === 0 &&
      info.num_ack_pending === 0 &&
      info.ack_floor.stream_seq >= stream.state.last_seq
    ) {
      // Whatever was published before the acks has been written to this connection too.
      await nc.flush();
      return;
    }
    if (Date.now() > limit) throw new Error(`events still pending: ${JSON.stringify(info)}`);
    await new Promise((resolve) => setImmediate(resolve));
  }
}

/** How many schema messages the sessions stream holds for the session and tool. */
async function storedSchemas(session: Session, tool: string): Promise<number> {
  const subject = subjects.schema(session.address, tool);
  const info = await jsm.streams.info(subjects.streams.sessions, { subjects_filter: subject });
  return info.state.subjects?.[subject] ?? 0;
}

beforeAll(async () => {
  server = await startNatsServer();
  env = {
    NATS_URL: server.url,
    TOOLMESH_TOOLS_DIR: fixtureTools("tools-schema"),
    TOOLMESH_CONFIG_DIR: CONFIGS,
  };
  resolver = await startService("resolver", env);
  await startService("executor", env);
  await toolAvailable(resolver, ...TOOLS);
  expanders = await Promise.all([startExpander(), startExpander()]);
  nc = await connect({ servers: server.url });
  jsm = await jetstreamManager(nc);
  client = new ToolmeshClient(nc, { defaultTimeoutMs: 15_000 });
  store = await StateStore.open(nc, { subjects });
});

afterAll(async () => {
  await nc?.close();
  await killAllServices();
  await server?.stop();
});

describe("schema expansion", () => {
  it("sends the full schema, once, the first time a session calls a tool with arguments missing", async () => {
    const session = client.session("s-first");
    const events = schemaEvents(session);
    const message = await call(session, "geo.lookup", { country: "IT" });
    expect(message.error?.code).toBe("missing_arguments");
    expect(await session.waitForSchema("geo.lookup", 10_000)).toBe(true);
    expect(events).toHaveLength(1);
    const [event] = events;
    expect(event).toMatchObject({
      tool: "geo.lookup",
      session_id: "s-first",
      reason: "missing_arguments",
      tool_call_id: message.tool_call_id,
      missing: ["city"],
      required: ["city"],
      summary: "Finds a place by name.",
      groups: ["geo"],
    });
    // System and preset params removed; the rest as registered.
    expect(event?.parameters).toEqual({
      type: "object",
      properties: {
        city: { type: "string", description: "City name" },
        country: { type: "string", default: "FR" },
      },
      required: ["city"],
    });
    // The missing_arguments error carries the same model-facing schema: no system params.
    expect(message.error?.details?.parameters).toEqual(event?.parameters);
    const state = await store.getSchemas(session.address);
    expect(state?.value.requested_tools).toEqual(["geo.lookup"]);
    expect(state?.value.expanded_tools.get("geo.lookup")).toBe(event?.revision);

    // The client hands it to the next turn once, and declares the tool expanded from now on.
    const supplements = session.takeSupplementedSchemas();
    expect(supplements).toEqual([
      expect.objectContaining({ tool: "geo.lookup", missing: ["city"] }),
    ]);
    expect(session.takeSupplementedSchemas()).toEqual([]);
    const catalog = await session.catalog();
    expect(catalog.tools.find((t) => t.name === "geo.lookup")?.parameters).toEqual(
      event?.parameters,
    );
    expect(catalog.tools.find((t) => t.name === "ping")?.parameters).toBeUndefined();

    // A second incomplete call gets missing_arguments again, but no second schema.
    const again = await call(session, "geo.lookup", {});
    expect(again.error?.code).toBe("missing_arguments");
    await expandersDone();
    expect(events).toHaveLength(1);
    expect(await storedSchemas(session, "geo.lookup")).toBe(1);
    session.close();
  });

  it("lets a frontend that was away catch up on its schema events, one kind at a time", async () => {
    const session = client.session("s-away");
    expect((await call(session, "geo.lookup", {})).error?.code).toBe("missing_arguments");
    expect(await session.waitForSchema("geo.lookup", 10_000)).toBe(true);
    // nats-server 2.9 refuses a consumer on the whole session, whose progress is not stored
    // (ConsumerFilterNotSubset); newer servers take it. One kind at a time works on both.
    if (nc.info?.version.startsWith("2.9.") === true) {
      const whole = await jsm.consumers
        .add(subjects.streams.sessions, {
          filter_subject: subjects.sessionEvents(session.address),
          ack_policy: AckPolicy.None,
          deliver_policy: DeliverPolicy.LastPerSubject,
        })
        .catch((err: unknown) => err);
      expect((whole as JetStreamApiError).code).toBe(JsApiCode.ConsumerFilterNotSubset);
    }
    // The documented way: an ordered consumer on the session's schema subjects.
    const consumer = await jetstream(nc).consumers.get(subjects.streams.sessions, {
      filter_subjects: subjects.sessionEvents(session.address).replace(/>$/, "schema.*"),
      deliver_policy: DeliverPolicy.LastPerSubject,
    });
    const first = await consumer.next({ expires: 5_000 });
    expect(first?.json<SchemaEvent>()).toMatchObject({ tool: "geo.lookup", session_id: "s-away" });
    session.close();
  });

  it("sends another session its own copy", async () => {
    const session = client.session("s-second");
    const events = schemaEvents(session);
    expect((await call(session, "geo.lookup", {})).error?.code).toBe("missing_arguments");
    expect(await session.waitForSchema("geo.lookup", 10_000)).toBe(true);
    expect(events.map((e) => [e.session_id, e.tool])).toEqual([["s-second", "geo.lookup"]]);
    session.close();
  });

  it("never publishes twice with two replicas, even for calls racing in parallel", async () => {
    const sessions = Array.from({ length: 8 }, (_, i) => client.session(`s-race-${i}`));
    const events = sessions.map(schemaEvents);
    const results = await Promise.all(
      sessions.flatMap((session) =>
        Array.from({ length: 6 }, (_, n) => call(session, "note", { title: `t${n}` })),
      ),
    );
    expect(new Set(results.map((m) => m.error?.code))).toEqual(new Set(["missing_arguments"]));
    await expandersDone();
    expect(events.map((e) => e.length)).toEqual(sessions.map(() => 1));
    for (const session of sessions) expect(await storedSchemas(session, "note")).toBe(1);
    // Each send is logged once; the lines come through the processes' pipes after the fact.
    const sent = () =>
      expanders
        .flatMap((e) => e.lines)
        .filter((l) => l.msg === "schema sent to the session" && l.tool === "note");
    await until("the expanders to log each send", () => sent().length >= sessions.length);
    expect(sent()).toHaveLength(sessions.length);
    for (const session of sessions) session.close();
  });

  it("sends it again when asked (expand), and describes tools on request", async () => {
    const session = client.session("s-first");
    const events = schemaEvents(session);
    const schema = await session.expand("geo.lookup");
    expect(await session.waitForSchema("geo.lookup", 10_000)).toBe(true);
    expect(events).toEqual([expect.objectContaining({ reason: "expand", tool: "geo.lookup" })]);
    expect(schema.parameters).toEqual(events[0]?.parameters);

    const described = await session.describe(["ping", "nope", "ping"]);
    expect(described.schemas.map((s) => s.tool)).toEqual(["ping"]);
    expect(described.errors).toEqual([
      { tool: "nope", error: expect.objectContaining({ code: "unknown_tool" }) },
    ]);
    const state = await store.getSchemas(session.address);
    expect(state?.value.requested_tools).toEqual(["geo.lookup", "ping"]);
    expect([...(state?.value.expanded_tools.keys() ?? [])].sort()).toEqual(["geo.lookup", "ping"]);
    session.close();
  });

  it("sends it again once the tool's registry revision changed", async () => {
    const registry = await ToolRegistry.open(nc, {
      subjects,
      log: { warn: () => undefined },
      watch: false,
    });
    const current = await registry.fetch("geo.lookup");
    expect(current).toBeDefined();
    const outcome = await registry.register({
      ...current!,
      description: "Finds a place by name. Answers with its coordinates and timezone.",
    });
    expect(outcome.status).toBe("updated");
    const revision = (outcome as { revision: number }).revision;
    await Promise.all([resolver, ...expanders].map((s) => sees(s, "geo.lookup", revision)));

    const session = client.session("s-first");
    const events = schemaEvents(session);
    expect((await call(session, "geo.lookup", {})).error?.code).toBe("missing_arguments");
    expect(await session.waitForSchema("geo.lookup", 10_000)).toBe(true);
    expect(events).toEqual([
      expect.objectContaining({
        reason: "missing_arguments",
        revision,
        description: "Finds a place by name. Answers with its coordinates and timezone.",
      }),
    ]);
    session.close();
  });

  it("remembers what it sent across a restart of the schema expanders", async () => {
    await Promise.all(expanders.map((e) => e.stop()));
    expanders = [await startExpander()];

    const known = client.session("s-first");
    const knownEvents = schemaEvents(known);
    expect((await call(known, "geo.lookup", {})).error?.code).toBe("missing_arguments");
    await expandersDone();
    expect(knownEvents).toEqual([]);

    const fresh = client.session("s-after-restart");
    const freshEvents = schemaEvents(fresh);
    expect((await call(fresh, "geo.lookup", {})).error?.code).toBe("missing_arguments");
    expect(await fresh.waitForSchema("geo.lookup", 10_000)).toBe(true);
    expect(freshEvents).toHaveLength(1);
    expanders.push(await startExpander());
    known.close();
    fresh.close();
  });
});

describe("tool groups", () => {
  it("switched off for one session: gone from its catalog, tool_disabled, other sessions untouched", async () => {
    const off = client.session("s-groups-off");
    const on = client.session("s-groups-on");
    const offEvents = schemaEvents(off);
    const groups = await off.setGroups({ disable: ["notes"] });
    await resolverSees("s-groups-off", "note", {}, "tool_disabled");
    expect(groups.find((g) => g.name === "notes")).toEqual({
      name: "notes",
      active: false,
      source: "session",
      tools: ["note"],
    });
    expect((await off.catalog()).tools.map((t) => t.name)).toEqual(["geo.lookup", "ping", "purge"]);
    expect((await on.catalog()).tools.map((t) => t.name)).toEqual([
      "geo.lookup",
      "note",
      "ping",
      "purge",
    ]);

    // Disabled comes before the arguments: no missing_arguments, so no schema leaks out.
    const disabled = await call(off, "note", {});
    expect(disabled.error).toEqual({
      code: "tool_disabled",
      message: 'tool "note" is disabled: its group (notes) is inactive for this session',
      retryable: false,
      details: { tool: "note", groups: [{ name: "notes", source: "session" }] },
    });
    expect((await call(on, "note", { title: "a", body: "b" })).error).toBeUndefined();

    await off.setGroups({ reset: ["notes"] });
    await resolverSees("s-groups-off", "note", { title: "a", body: "b" }, undefined);
    expect((await call(off, "note", { title: "a", body: "b" })).error).toBeUndefined();
    await expandersDone();
    expect(offEvents).toEqual([]);
    off.close();
    on.close();
  });

  it("switched off for the tenant: every session, unless a session switches it back on", async () => {
    const plain = client.session("s-tenant-plain");
    const special = client.session("s-tenant-special");
    try {
      const tenant = await client.setGroups({ disable: ["admin", "ops"] });
      expect(tenant.filter((g) => !g.active).map((g) => [g.name, g.source])).toEqual([
        ["admin", "tenant"],
        ["ops", "tenant"],
      ]);
      await resolverSees("s-tenant-plain", "purge", { target: "all" }, "tool_disabled");
      const denied = await call(plain, "purge", { target: "all" });
      expect(denied.error?.code).toBe("tool_disabled");
      expect(denied.error?.details?.groups).toEqual([
        { name: "admin", source: "tenant" },
        { name: "ops", source: "tenant" },
      ]);
      expect((await client.catalog()).tools.map((t) => t.name)).not.toContain("purge");

      // One active group is enough; the session's switch wins over the tenant's.
      await special.setGroups({ enable: ["ops"] });
      await resolverSees("s-tenant-special", "purge", { target: "all" }, undefined);
      expect((await special.catalog()).tools.map((t) => t.name)).toContain("purge");
      expect(await call(special, "purge", { target: "all" })).toMatchObject({
        content: '{"purged":"all"}',
      });
      expect((await call(plain, "purge", { target: "all" })).error?.code).toBe("tool_disabled");
      const seen = await special.groups();
      expect(seen.find((g) => g.name === "ops")).toMatchObject({ active: true, source: "session" });
      expect(seen.find((g) => g.name === "admin")).toMatchObject({
        active: false,
        source: "tenant",
      });
    } finally {
      await client.setGroups({ reset: ["admin", "ops"] });
    }
    await resolverSees("s-tenant-plain", "purge", { target: "x" }, undefined);
    expect((await call(plain, "purge", { target: "x" })).error).toBeUndefined();
    plain.close();
    special.close();
  });

  // Six CLI processes in a row: each starts Node and connects, slow on a busy machine.
  it("is switched from the command line, for the tenant or one session", async () => {
    const off = await runCli(["groups", "disable", "notes", "--session", "s-cli", "--json"], env);
    expect(off.code).toBe(0);
    expect(JSON.parse(off.stdout)).toContainEqual({
      name: "notes",
      active: false,
      source: "session",
      tools: ["note"],
    });
    const list = await runCli(["groups", "list"], env);
    expect(list.stdout).toMatch(/^notes\s+active \(default\)\s+note$/m);
    const catalog = await runCli(["catalog", "--session", "s-cli", "--format", "openai"], env);
    expect(catalog.code).toBe(0);
    const tools = JSON.parse(catalog.stdout) as { function: { name: string } }[];
    expect(tools.map((t) => t.function.name)).toEqual(["geo_lookup", "ping", "purge"]);
    const agent = await runCli(["catalog", "--agent", "traveller"], env);
    expect(agent.stdout).toMatch(/^geo\.lookup\s+Finds a place by name\.$/m);
    expect(agent.stderr).toContain("not registered (listed by agent traveller): not_registered");
    const prompt = await runCli(["catalog", "--agent", "scribe", "--format", "prompt"], env);
    expect(prompt.stdout).toContain("`note`");
    const unknown = await runCli(["catalog", "--agent", "ghost"], env);
    expect(unknown.code).toBe(1);
    expect(unknown.stdout).toMatch(/^permission_denied: unknown agent "ghost"/);
  }, 180_000);

  it("refuses a request naming a group twice", async () => {
    await expect(client.setGroups({ enable: ["x"], disable: ["x"] })).rejects.toMatchObject({
      code: "invalid_request",
    });
  });
});

describe("agents and tool sets", () => {
  it("merges an agent's tool sets and tools, first wins, with a warning", async () => {
    for (const service of [resolver, ...expanders]) {
      const warning = await service.waitForLog(
        (l) => l.code === "duplicate_tool" && l.agent === "traveller",
      );
      expect(warning).toMatchObject({
        level: 40,
        tool: "note",
        file: "agents/traveller.yaml",
        msg: 'agent "traveller" (agents/traveller.yaml) gets tool "note" from tool set "notebook" and again from its own tools; keeping the first',
      });
    }
    const catalog = await client.catalog({ agent: "traveller" });
    expect(catalog).toEqual({
      ok: true,
      agent: "traveller",
      tools: [
        expect.objectContaining({ name: "geo.lookup", summary: "Finds a place by name." }),
        expect.objectContaining({ name: "note", summary: "Writes a note." }),
        expect.objectContaining({ name: "ping", summary: "Answers pong." }),
      ],
      output_strategy: { function_calling: false, fallback_to_structured_output: true },
      unavailable: ["not_registered"],
    });
    expect(catalog.tools.every((t) => t.parameters === undefined)).toBe(true);
  });

  it("lets a call naming an agent use only that agent's tools", async () => {
    const session = client.session("s-agent-field");
    expect(
      (await call(session, "note", { title: "a", body: "b" }, "scribe")).error,
    ).toBeUndefined();
    const denied = await call(session, "ping", {}, "scribe");
    expect(denied.error).toMatchObject({
      code: "permission_denied",
      details: { tool: "ping", agent: "scribe", reason: "not_in_agent_tools" },
    });
    const unknown = await call(session, "ping", {}, "ghost");
    expect(unknown.error).toMatchObject({
      code: "permission_denied",
      details: { agent: "ghost", reason: "unknown_agent" },
    });
    // Unknown tools are suggested only among the agent's own.
    const typo = await call(session, "nte", {}, "scribe");
    expect(typo.error?.details?.close_matches).toEqual(["note"]);
    session.close();
  });

  it("holds a session bound to an agent to that agent's tools", async () => {
    const session = client.session("s-bound");
    const catalog = await session.catalog({ agent: "scribe", bindAgent: true });
    expect(catalog.tools.map((t) => t.name)).toEqual(["note"]);
    expect((await session.catalog()).agent).toBe("scribe");

    const denied = await call(session, "ping", {});
    expect(denied.error).toMatchObject({
      code: "permission_denied",
      details: { tool: "ping", agent: "scribe", reason: "not_in_agent_tools" },
    });
    expect((await call(session, "note", { title: "a", body: "b" })).error).toBeUndefined();
    const other = await call(session, "note", { title: "a", body: "b" }, "traveller");
    expect(other.error?.details).toMatchObject({ bound_agent: "scribe", reason: "other_agent" });

    await expect(session.catalog({ agent: "traveller", bindAgent: true })).rejects.toBeInstanceOf(
      ToolmeshError,
    );
    const schemaDenied = await session.describe(["ping"]);
    expect(schemaDenied.errors[0]?.error.code).toBe("permission_denied");
    await expect(client.catalog({ agent: "ghost" })).rejects.toMatchObject({
      code: "permission_denied",
    });
    session.close();
  });

  it("refuses to start when an agent references a tool set no file defines", async () => {
    for (const service of ["schema-expander", "resolver"]) {
      const child = spawn(process.execPath, [join(ROOT, "services", service, "dist", "main.js")], {
        cwd: ROOT,
        env: {
          PATH: process.env.PATH ?? "",
          NATS_URL: server.url,
          TOOLMESH_CONFIG_DIR: join(ROOT, "test", "fixtures", "configs-missing-set"),
        },
        stdio: ["ignore", "ignore", "pipe"],
      });
      let stderr = "";
      child.stderr.setEncoding("utf8").on("data", (chunk: string) => (stderr += chunk));
      const [code] = (await once(child, "exit")) as [number | null];
      expect(code).toBe(1);
      expect(stderr).toBe(
        `toolmesh ${service}: agent "broken" (agents/broken.yaml) references tool set "reports", ` +
          "which no file in tool_sets/ defines (defined: geography)\n",
      );
    }
  });
});
