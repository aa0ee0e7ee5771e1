import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { mkdtemp, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { connect } from "@nats-io/transport-node";
import type { NatsConnection } from "@nats-io/nats-core";
import { ToolmeshClient } from "@toolmesh/client";
import { createSubjects } from "@toolmesh/protocol";
import { PolicyStore, openPolicyBucket } from "@toolmesh/policy";
import { keyDigest } from "@toolmesh/gateway";
import { gatewayAgents, gatewayTools, mcpClient, startGateway } from "./helpers/gateway.js";
import { killAllServices, startService, toolAvailable } from "./helpers/mesh.js";
import type { ServiceProcess } from "./helpers/mesh.js";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";

// Policies decide on who a call acts for: two gateway API keys of one tenant name two subjects,
// and a policy on `context.subject` lets one of them call a tool (and see it in `tools/list`)
// and refuses (and hides) it from the other.

const DESK_KEY = "key-acme-desk-0123456789abcdef";
const INTERN_KEY = "key-acme-intern-0123456789abcdef";

const WHOAMI = `export default {
  name: "whoami",
  description: "Returns who the call acts for.",
  parameters: { type: "object", properties: {} },
  handler(_args, ctx) { return { subject: ctx.identity?.subject ?? null }; },
};
`;

const LEDGER = `export default {
  name: "ledger",
  description: "Returns the ledger's owner.",
  parameters: { type: "object", properties: {} },
  handler() { return { owner: "finance" }; },
};
`;

const POLICY = `@id("all")
permit (principal, action, resource);

@id("no-interns")
forbid (principal, action == Toolmesh::Action::"call", resource == Toolmesh::Tool::"whoami")
when { context has subject && context.subject == "intern@acme" };

@id("ledger-hidden-from-interns")
forbid (principal, action == Toolmesh::Action::"list", resource == Toolmesh::Tool::"ledger")
when { context has subject && context.subject == "intern@acme" };
`;

let server: NatsServerHandle;
let nc: NatsConnection;
let gateway: { process: ServiceProcess; url: string; port: number };

beforeAll(async () => {
  server = await startNatsServer();
  const [tools, configs] = await Promise.all([gatewayTools(), gatewayAgents()]);
  await writeFile(join(tools, "whoami.js"), WHOAMI);
  await writeFile(join(tools, "ledger.js"), LEDGER);
  const keysFile = join(await mkdtemp(join(tmpdir(), "toolmesh-subject-keys-")), "keys.yaml");
  const entry = (key: string, name: string): string[] => [
    `  - sha256: ${keyDigest(key)}`,
    "    tenant: acme",
    `    name: ${name}`,
    `    subject: ${name}@acme`,
  ];
  await writeFile(
    keysFile,
    ["keys:", ...entry(DESK_KEY, "desk"), ...entry(INTERN_KEY, "intern"), ""].join("\n"),
  );
  const env = {
    NATS_URL: server.url,
    TOOLMESH_TOOLS_DIR: tools,
    TOOLMESH_CONFIG_DIR: configs,
    TOOLMESH_TOOLKIT_CONTEXT: JSON.stringify({ ledgerDir: tools }),
  };
  const [resolver] = await Promise.all([
    startService("resolver", env, 60_000),
    startService("executor", env, 60_000),
    startService("schema-expander", env, 60_000),
  ]);
  await Promise.all([toolAvailable(resolver, "whoami"), toolAvailable(resolver, "ledger")]);
  nc = await connect({ servers: server.url });
  const store = new PolicyStore(await openPolicyBucket(nc, { subjects: createSubjects() }));
  const { revision } = await store.set(POLICY);
  await resolver.waitForLog(
    (l) => l.msg === "policy set applied" && l.key === "operator" && l.revision === revision,
  );
  gateway = await startGateway({ ...env, TOOLMESH_GATEWAY_KEYS_FILE: keysFile });
}, 150_000);

afterAll(async () => {
  await nc?.close();
  await killAllServices();
  await server?.stop();
});

async function call(key: string, name = "whoami"): Promise<{ isError: boolean; text: string }> {
  const c = await mcpClient(gateway.url, key, {}, "2026-07-28");
  try {
    const result = await c.callTool({ name, arguments: {} });
    const first = result.content[0] as { text?: string } | undefined;
    return { isError: result.isError ?? false, text: first?.text ?? "" };
  } finally {
    await c.close();
  }
}

async function listed(key: string): Promise<string[]> {
  const c = await mcpClient(gateway.url, key, {}, "2026-07-28");
  try {
    return (await c.listTools()).tools.map((t) => t.name);
  } finally {
    await c.close();
  }
}

describe("a policy on context.subject", () => {
  it("decides the gateway's tools/list with the credential's subject, as the call path does", async () => {
    const [desk, intern] = await Promise.all([listed(DESK_KEY), listed(INTERN_KEY)]);
    expect(desk).toContain("whoami");
    // The intern may never call it, so it is never shown it; the rest of the list is the same.
    expect(intern).not.toContain("whoami");
    expect(desk).toContain("ledger");
    expect(intern).not.toContain("ledger");
    expect(intern.length).toBeGreaterThan(0);
    expect(intern.sort()).toEqual(desk.filter((t) => t !== "whoami" && t !== "ledger").sort());
  });

  it("lets the subject it allows call the tool", async () => {
    const desk = await call(DESK_KEY);
    expect(desk.isError).toBe(false);
    expect(JSON.parse(desk.text)).toEqual({ subject: "desk@acme" });
  });

  it("refuses the subject it forbids, naming the policy's refusal", async () => {
    const intern = await call(INTERN_KEY);
    expect(intern.isError).toBe(true);
    expect(intern.text).toMatch(/permission_denied|not allowed|polic/i);
    expect(intern.text).not.toContain('intern@acme"}');
  });

  it("refuses a NATS frontend's call of a tool hidden from the subject it acts for", async () => {
    // The list policy names the subject: the resolver's check before a call decides it with the
    // call's identity, so a tool never shown to a subject cannot be called for it either.
    const client = new ToolmeshClient(nc, { tenant: "acme" });
    const as = (subject: string) => ({
      identity: { issuer: "urn:example:sso", subject, tenant: "acme" },
    });
    const session = client.session("s-frontend");
    const [desk, intern] = await Promise.all([
      session.submit({ id: "ledger-desk", name: "ledger", arguments: {} }, as("desk@acme")).result,
      session.submit({ id: "ledger-intern", name: "ledger", arguments: {} }, as("intern@acme"))
        .result,
    ]);
    expect(desk.error).toBeUndefined();
    expect(intern.error).toMatchObject({
      code: "permission_denied",
      details: { tool: "ledger", policies: ["operator:ledger-hidden-from-interns"] },
    });
    expect(intern.error?.message).toMatch(/not available to this caller/);
  });
});
