import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { Kvm } from "@nats-io/kv";
import {
  MESH_ACCOUNT,
  ownerAccount,
  renderAccountConfig,
  rolePermissions,
  tenantAccount,
} from "@toolmesh/nats";
import { ToolmeshClient } from "@toolmesh/client";
import { ownerCallPlane } from "@toolmesh/call-store";
import { Defaults, ErrorCode, ToolDefinitionSchema, createSubjects } from "@toolmesh/protocol";
import { runCli } from "./helpers/cli.js";
import type { ServiceProcess } from "./helpers/mesh.js";
import { until } from "./helpers/eventually.js";
import { killAllServices, startService } from "./helpers/mesh.js";
import { startNatsServer, stopAll, type NatsServerHandle } from "./helpers/nats-server.js";
import { accountUsers } from "./helpers/account-users.js";
import { createTestPki, type TestPki } from "./helpers/tls.js";

// A tenant and a tool owner try to stop the mesh's services with sizes, under the accounts
// `toolmesh auth config` generates, with TLS: a session-confined frontend's dry run whose answer
// would exceed the server's max_payload, a real call whose result would, and a rogue owner's
// oversized registrations and definitions. Each is refused with a typed error naming the limit
// and the size, a second tenant's calls keep succeeding during and after, and no service
// process exits.
//
// Run on both server versions: TOOLMESH_TEST_NATS_SERVER=/opt/nats-server-current/usr/sbin/nats-server.

const subjects = createSubjects();
const START_MS = 120_000;
const KB = 1024;
/** The executor's TOOLMESH_MAX_RESULT_BYTES. */
const MAX_RESULT_BYTES = 200 * KB;

let pki: TestPki;
let server: NatsServerHandle;
let services: ServiceProcess[] = [];
let mesh: NatsConnection;
let globex: ToolmeshClient;
const { exportPasswords, credentials, connectAs, closeAll } = accountUsers(() => ({
  url: server.url,
  pki,
}));

const EVERYTHING = { publish: { allow: [">"] }, subscribe: { allow: [">"] } };

function attackConfig(): string {
  return renderAccountConfig({
    tenants: ["acme", "globex"],
    owners: { rogue: [] },
    extraUsers: [
      {
        account: tenantAccount("acme"),
        user: "frontend-acme-s1",
        permissions: rolePermissions("frontend", { tenant: "acme", session: "s1" }),
      },
      // The rogue owner with every right in its account: its crossings alone confine it.
      { account: ownerAccount("rogue"), user: "rogue", permissions: EVERYTHING },
      { account: MESH_ACCOUNT, user: "observer", permissions: EVERYTHING },
    ],
  });
}

/** A call of globex's that must succeed whatever the others do. */
async function globexCall(text: string): Promise<void> {
  const session = globex.session(`g-${Math.random().toString(36).slice(2)}`);
  try {
    const result = await session.submit({ name: "echo", arguments: { text } }).result;
    expect(result.error).toBeUndefined();
    expect(result.content).toBe(text);
  } finally {
    session.close();
  }
}

/** Every service is still running: none exited under the attacks. */
function expectAllRunning(): void {
  for (const service of services) {
    expect(service.child.exitCode, service.stderr()).toBeNull();
    expect(service.child.signalCode).toBeNull();
  }
}

beforeAll(async () => {
  pki = await createTestPki();
  const config = attackConfig();
  exportPasswords(config);
  server = await startNatsServer({ config: `${config}\n${pki.serverTlsBlock()}\n` });
  const setup = await runCli(
    ["setup", "--tenants", "acme,globex", "--owners", "rogue"],
    credentials("setup"),
  );
  expect(setup.stderr).toBe("");
  services = await Promise.all([
    startService("resolver", credentials("resolver"), START_MS),
    startService(
      "executor",
      {
        ...credentials("executor"),
        TOOLMESH_TOOLS_DIR: "tools/builtin",
        TOOLMESH_MAX_RESULT_BYTES: String(MAX_RESULT_BYTES),
      },
      START_MS,
    ),
    startService("schema-expander", credentials("schema-expander"), START_MS),
  ]);
  mesh = await connectAs("observer");
  const globexNc = await connectAs("frontend-globex", {
    inboxPrefix: subjects.frontendInboxPrefix("globex"),
  });
  globex = new ToolmeshClient(globexNc, { tenant: "globex", defaultTimeoutMs: 30_000 });
  await globexCall("before");
}, 3 * START_MS);

afterAll(async () => {
  await closeAll();
  await killAllServices();
  await server?.stop();
  await stopAll();
  await pki?.remove();
});

describe("a tenant's oversized requests", () => {
  it("a dry run whose answer exceeds max_payload is refused payload_too_large; the resolver stays up", async () => {
    const nc = await connectAs("frontend-acme-s1", {
      inboxPrefix: subjects.frontendInboxPrefix("acme", "s1"),
    });
    const acme = new ToolmeshClient(nc, { tenant: "acme", defaultTimeoutMs: 30_000 });
    const text = "x".repeat(700 * KB);
    const during = Promise.all([globexCall("during 1"), globexCall("during 2")]);
    for (let i = 0; i < 3; i++) {
      const reply = await acme.resolve("s1", { name: "echo", arguments: { text } });
      expect(reply).toMatchObject({
        ok: false,
        error: {
          code: ErrorCode.PayloadTooLarge,
          retryable: false,
          details: { field: "reply", limit: mesh.info?.max_payload },
        },
      });
      const details = reply.ok ? undefined : reply.error.details;
      expect(details?.bytes).toBeGreaterThan(1024 * KB);
    }
    await during;
    // A small dry run of the same frontend is answered as before.
    expect(await acme.resolve("s1", { name: "echo", arguments: { text: "hi" } })).toMatchObject({
      ok: true,
    });
    await globexCall("after the dry runs");
    expectAllRunning();
  });

  it("a call whose result exceeds TOOLMESH_MAX_RESULT_BYTES ends payload_too_large naming both", async () => {
    const nc = await connectAs("frontend-acme-s1", {
      inboxPrefix: subjects.frontendInboxPrefix("acme", "s1"),
    });
    const acme = new ToolmeshClient(nc, { tenant: "acme", defaultTimeoutMs: 30_000 });
    const session = acme.session("s1");
    // Arguments travel twice in the resolved call (arguments, input_parameters): 300 KB fits.
    const text = "y".repeat(300 * KB);
    const [result] = await Promise.all([
      session.submit({ name: "echo", arguments: { text } }).result,
      globexCall("during the large result"),
    ]);
    session.close();
    expect(result.error).toMatchObject({
      code: ErrorCode.PayloadTooLarge,
      retryable: false,
      details: { limit: MAX_RESULT_BYTES },
    });
    expect((result.error?.details as { bytes: number }).bytes).toBeGreaterThan(300 * KB);
    await globexCall("after the large result");
    expectAllRunning();
  });
});

describe("a rogue tool owner's oversized tools", () => {
  const tool = (name: string, description: string) => ({
    name,
    description,
    summary: "Looks harmless.",
    kind: "builtin" as const,
    parameters: { type: "object", properties: {} },
  });

  it("registering two tools with 600 KB descriptions is refused before any work", async () => {
    const plane = ownerCallPlane(await connectAs("rogue"), { subjects, owner: "rogue" });
    const big = "d".repeat(600 * KB);
    const during = globexCall("during the registrations");
    for (const name of ["rogue.a", "rogue.b"]) {
      await expect(plane.register(tool(name, big))).rejects.toMatchObject({
        code: ErrorCode.PayloadTooLarge,
        retryable: false,
        details: { field: "request", limit: Defaults.maxToolDefinitionBytes + 4 * KB },
      });
    }
    await during;
    // Under the request limit but over a tool's description limit: refused by the registry.
    await expect(plane.register(tool("rogue.c", "d".repeat(20 * KB)))).rejects.toMatchObject({
      code: ErrorCode.PayloadTooLarge,
      details: {
        field: "description",
        bytes: 20 * KB,
        limit: Defaults.maxToolDescriptionBytes,
        tool: "rogue.c",
      },
    });
    const registry = await new Kvm(mesh).open(subjects.registryBucket);
    for (const name of ["rogue.a", "rogue.b", "rogue.c"])
      expect(await registry.get(subjects.registryKey(name))).toBeNull();
    // Within the limits the rogue registers as before.
    await expect(plane.register(tool("rogue.small", "A small tool."))).resolves.toMatchObject({
      status: "created",
    });
    const catalog = await globex.catalog();
    expect(catalog.tools.map((t) => t.name)).toContain("rogue.small");
    await globexCall("after the registrations");
    expectAllRunning();
  });

  it("definitions stored before the limits are described one answer at a time, not the expander's end", async () => {
    // What an older mesh let an owner store: two definitions a describe answer cannot carry.
    const registry = await new Kvm(mesh).open(subjects.registryBucket);
    for (const name of ["rogue.old1", "rogue.old2"]) {
      const definition = ToolDefinitionSchema.parse({
        ...tool(name, "o".repeat(600 * KB)),
        owner: "rogue",
        owner_account: true,
      });
      await registry.put(subjects.registryKey(name), JSON.stringify(definition));
    }
    // The expander learns them from its watch of the registry: its catalog lists both.
    await until("the schema expander to list both definitions", async () => {
      const names = (await globex.catalog()).tools.map((t) => t.name);
      return names.includes("rogue.old1") && names.includes("rogue.old2");
    });
    const session = globex.session("describer");
    // Both do not fit in one answer: the first is described, the second refused, to ask again.
    const both = await session.describe(["rogue.old1", "rogue.old2"]);
    expect(both.schemas.map((s) => s.tool)).toEqual(["rogue.old1"]);
    expect(both.errors).toMatchObject([
      {
        tool: "rogue.old2",
        error: { code: ErrorCode.PayloadTooLarge, details: { field: "reply", tool: "rogue.old2" } },
      },
    ]);
    const second = await session.describe(["rogue.old2"]);
    expect(second.schemas.map((s) => s.tool)).toEqual(["rogue.old2"]);
    session.close();
    const catalog = await globex.catalog();
    expect(catalog.tools.map((t) => t.name)).toEqual(
      expect.arrayContaining(["echo", "rogue.old1", "rogue.old2"]),
    );
    // Removed, they leave nothing behind: the expander answers as before.
    for (const name of ["rogue.old1", "rogue.old2"])
      await registry.delete(subjects.registryKey(name));
    await globexCall("after the old definitions");
    expect((await globex.catalog()).tools.map((t) => t.name)).not.toContain("rogue.old1");
    expectAllRunning();
  });
});
