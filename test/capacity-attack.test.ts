import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import type { Executor, ToolModule } from "@toolmesh/tool-host";
import { startExecutor } from "@toolmesh/tool-host";
import type { Resolver } from "@toolmesh/resolver";
import { startResolver } from "@toolmesh/resolver";
import type { CapacityAnnouncement } from "@toolmesh/registry";
import { ToolCapacity, ToolRegistry, parseCapacity } from "@toolmesh/registry";
import { ownerCallPlane } from "@toolmesh/call-store";
import { createSubjects, encodeJson } from "@toolmesh/protocol";
import { createLogger, initTelemetry } from "@toolmesh/telemetry";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { startRogueAndVictim } from "./helpers/owner-accounts.js";
import { until } from "./helpers/eventually.js";

// A rogue tool owner (acme) tries to widen or narrow the fair-share window of another owner's
// tool (globex's echo, served by one executor of concurrency 3) by announcing capacity, from its
// own account under the accounts `toolmesh auth config` generates, as a user with every right in
// its account. Runs on whichever nats-server is first on the PATH (2.9.10 and the current).
const subjects = createSubjects({ prefix: "cap" });
const log = createLogger({ service: "test", level: "silent" });

let server: NatsServerHandle;
let mesh: NatsConnection;
let rogue: NatsConnection;
let globexNc: NatsConnection;
let registry: ToolRegistry;
let resolver: Resolver;
let globex: Executor;
let capacity: ToolCapacity;
const heard: { subject: string; body: CapacityAnnouncement | undefined }[] = [];

const echo: ToolModule = {
  name: "echo",
  description: "Echoes its text.",
  parameters: { type: "object", properties: { text: { type: "string" } }, required: ["text"] },
  handler: (args: Record<string, unknown>) => ({ echoed: args.text }),
};

beforeAll(async () => {
  ({ server, mesh, rogue, globexNc } = await startRogueAndVictim(subjects));
  registry = await ToolRegistry.open(mesh, { subjects, log });
  const tracer = initTelemetry({ serviceName: "test", env: {} }).tracer;
  resolver = await startResolver({ nc: mesh, subjects, registry, log, tracer });
  capacity = new ToolCapacity({
    nc: mesh,
    subjects,
    ownerOf: (tool) => registry.get(tool)?.definition.owner,
    log,
  });
  mesh.subscribe(subjects.allOwnerCapacity, {
    callback: (err, msg) => {
      if (err === null) heard.push({ subject: msg.subject, body: parseCapacity(msg.data) });
    },
  });
  await mesh.flush();
  await ownerCallPlane(rogue, { subjects, owner: "acme" }).register({
    name: "acme.tool",
    description: "The rogue's own tool.",
    summary: "The rogue's own tool.",
    kind: "builtin",
    parameters: { type: "object", properties: {} },
  });
  globex = await startExecutor({
    nc: globexNc,
    subjects,
    ownerAccount: "globex",
    tools: [echo],
    concurrency: 3,
    log,
    tracer,
  });
  await until(
    "both owners' capacity heard",
    () => capacity.windowOf("echo") === 3 && registry.get("acme.tool") !== undefined,
    { everyMs: 20 },
  );
}, 60_000);

afterAll(async () => {
  capacity?.stop();
  await globex?.stop(1_000);
  await resolver?.stop(1_000);
  registry?.close();
  await Promise.all([mesh?.close(), rogue?.close(), globexNc?.close()]);
  await server?.stop();
});

describe("capacity announcements from a rogue tool owner", () => {
  it("cannot widen or narrow another owner's tool, and its own announcements still count", async () => {
    const real = heard.find((h) => h.subject === subjects.ownerCapacity("globex"))?.body;
    expect(real?.tools).toEqual(["echo"]);
    const forge = (subject: string, body: unknown) => rogue.publish(subject, encodeJson(body));
    // Widen: on the victim's subject, and on its own naming the victim's tool.
    forge(subjects.ownerCapacity("globex"), { instance: "x", concurrency: 1000, tools: ["echo"] });
    forge(subjects.ownerCapacity("acme"), { instance: "y", concurrency: 1000, tools: ["echo"] });
    // Narrow: the victim's replica (its instance id learnt) said to have stopped.
    const stopped = { instance: real?.instance, concurrency: 0, tools: ["echo"] };
    forge(subjects.ownerCapacity("globex"), stopped);
    forge(subjects.ownerCapacity("acme"), stopped);
    // Malformed: ignored with a warning, the subscription still serves.
    rogue.publish(subjects.ownerCapacity("acme"), new TextEncoder().encode("{not json"));
    forge(subjects.ownerCapacity("acme"), { instance: "z", concurrency: -5, tools: "echo" });
    // The rogue's own, legitimate announcement last: once it counts, everything the rogue
    // published before it on this connection has been heard, or was never let through.
    forge(subjects.ownerCapacity("acme"), {
      instance: "own",
      concurrency: 5,
      tools: ["acme.tool"],
    });
    await until("the rogue's own capacity heard", () => capacity.windowOf("acme.tool") === 5, {
      everyMs: 20,
    });
    expect(capacity.windowOf("echo")).toBe(3);
    // Nothing crossed on the victim's subject but its own executor's announcements.
    const onGlobex = heard.filter((h) => h.subject === subjects.ownerCapacity("globex"));
    expect(onGlobex.every((h) => h.body?.instance === real?.instance)).toBe(true);
    expect(onGlobex.every((h) => h.body?.concurrency === 3)).toBe(true);
  });

  it("counts a replica no more once it stops", async () => {
    await globex.stop(1_000);
    await until("the victim's farewell heard", () => capacity.windowOf("echo") === 0, {
      everyMs: 20,
    });
  });
});
