import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { ownerCallPlane } from "@toolmesh/call-store";
import { meshPlan, provisionMesh } from "@toolmesh/nats";
import type { Resolver } from "@toolmesh/resolver";
import { startResolver } from "@toolmesh/resolver";
import { ToolRegistry } from "@toolmesh/registry";
import { createSubjects } from "@toolmesh/protocol";
import { createLogger, initTelemetry } from "@toolmesh/telemetry";
import { runCli } from "./helpers/cli.js";
import { startNatsServer, stopAll, type NatsServerHandle } from "./helpers/nats-server.js";
import { ownerAccountsConfig } from "./helpers/owner-accounts.js";

// The work of a tool owner's tool waits on the owner's work stream (ADR 0041): `toolmesh stats`,
// as the generated `operator` user, and `toolmesh call`, as a user that may read JetStream (a
// frontend in a tenant's account reads none), read its queue there.
const subjects = createSubjects({ prefix: "oq" });
const log = createLogger({ service: "test", level: "silent" });
const TOOL = "acme.queued";

let server: NatsServerHandle;
let mesh: NatsConnection;
let acme: NatsConnection;
let registry: ToolRegistry;
let resolver: Resolver;
let operator: Record<string, string>;

beforeAll(async () => {
  server = await startNatsServer({ config: ownerAccountsConfig(subjects, { acme: [] }) });
  mesh = await connect({ servers: server.url, user: "mesh", pass: "mesh" });
  await provisionMesh(mesh, meshPlan(subjects));
  registry = await ToolRegistry.open(mesh, { subjects, log });
  const tracer = initTelemetry({ serviceName: "test", env: {} }).tracer;
  resolver = await startResolver({ nc: mesh, subjects, registry, log, tracer });
  // Registered by the owner, served by no executor: its calls stay queued.
  acme = await connect({ servers: server.url, user: "acme", pass: "acme" });
  await ownerCallPlane(acme, { subjects, owner: "acme" }).register({
    name: TOOL,
    description: "Never taken.",
    summary: "Never taken.",
    kind: "builtin",
    parameters: { type: "object", properties: {} },
  });
  for (let i = 0; registry.get(TOOL)?.definition.owner !== "acme"; i++) {
    if (i === 100) throw new Error(`${TOOL} never became acme's`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  operator = {
    NATS_URL: server.url,
    NATS_USER: "operator",
    NATS_PASSWORD: "operator",
    TOOLMESH_PREFIX: "oq",
  };
}, 60_000);

afterAll(async () => {
  await resolver?.stop(1_000);
  registry?.close();
  await Promise.all([mesh?.close(), acme?.close()]);
  await server?.stop();
  await stopAll();
});

describe("an owner's tool with no executor", () => {
  it("is named by `toolmesh call` as queued, and counted by `toolmesh stats`", async () => {
    const call = runCli(["call", TOOL, "--timeout-ms", "8000"], {
      ...operator,
      NATS_USER: "mesh",
      NATS_PASSWORD: "mesh",
    });
    // Its work waits on acme's work stream until the call's deadline.
    let pending: number | undefined;
    let storage: {
      stream: string;
      of: string;
      id?: string;
      messages: number;
      max_bytes: number;
    }[] = [];
    for (let i = 0; pending !== 1; i++) {
      if (i === 50) throw new Error(`the stats never counted the call's work (${pending})`);
      const stats = await runCli(["stats", "--json"], operator);
      expect(stats.stderr).toBe("");
      const parsed = JSON.parse(stats.stdout) as {
        tools: { tool: string; queue?: { pending: number; ack_pending: number } }[];
        storage: typeof storage;
      };
      pending = parsed.tools.find((t) => t.tool === TOOL)?.queue?.pending;
      storage = parsed.storage;
    }
    // What the owner's work stream holds, against its own bound (TOOLMESH_OWNER_STORE_BYTES).
    expect(storage.find((u) => u.of === "owner")).toMatchObject({
      id: "acme",
      messages: 1,
      max_bytes: 256 * 1024 ** 2,
    });
    expect(storage.filter((u) => u.of === "mesh").every((u) => u.max_bytes > 0)).toBe(true);
    const outcome = await call;
    expect(outcome.code).toBe(1);
    expect(outcome.stderr).toContain(
      `no executor serving "${TOOL}" is running: the call stays queued (1 waiting) until one starts`,
    );
  }, 60_000);
});
