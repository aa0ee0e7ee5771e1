import { readFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import {
  PERMISSION_ROLES,
  renderAccountConfig,
  rolePermissions,
  tenantAccount,
} from "./permissions.js";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");

describe("permissions", () => {
  it("the shipped deploy/nats/toolmesh.conf is what `toolmesh auth config` generates", async () => {
    const shipped = await readFile(join(ROOT, "deploy", "nats", "toolmesh.conf"), "utf8");
    expect(shipped).toBe(renderAccountConfig());
  });

  it("confines a frontend to its tenant, or to one session, and gives it no bucket, consumer or stream", () => {
    const tenant = rolePermissions("frontend", { tenant: "acme" });
    expect(tenant.subscribe.allow).toEqual([
      "toolmesh.v1.sessions.acme.*.>",
      "_INBOX.toolmesh.frontend.acme.>",
      "$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.>",
    ]);
    const session = rolePermissions("frontend", { tenant: "acme corp", session: "s.1" });
    expect(session.publish.allow).toContain("toolmesh.v1.calls.acme=20corp.s=2e1");
    expect(session.subscribe.allow).toContain("toolmesh.v1.sessions.acme=20corp.s=2e1.>");
    for (const subject of [...tenant.publish.allow, ...session.publish.allow]) {
      expect(subject).not.toMatch(/KV|CONSUMER|STREAM\.|\.work\.|control|\$JS\.ACK/);
    }
  });

  it("gives an executor the registry keys of its own tools and namespaces only", () => {
    const owned = rolePermissions("executor", { tools: ["echo", "acme.*"] });
    const keys = owned.publish.allow.filter((s) => s.startsWith("$KV.toolmesh_tools."));
    expect(keys).toEqual(["$KV.toolmesh_tools.echo", "$KV.toolmesh_tools.acme.*"]);
    const bridge = rolePermissions("mcp-bridge", { servers: ["github"] });
    expect(bridge.publish.allow).toContain("$KV.toolmesh_tools.github.*");
    expect(bridge.publish.allow).not.toContain("$KV.toolmesh_tools.>");
  });

  it("refuses options that do not fit the role, saying which", () => {
    expect(() => rolePermissions("frontend")).toThrow("the frontend role needs --tenant <id>");
    expect(() => rolePermissions("resolver", { tenant: "a" })).toThrow("frontend role");
    expect(() => rolePermissions("resolver", { tools: ["a"] })).toThrow("--tools is for");
    expect(() => rolePermissions("executor", { tools: ["a.b.*"] })).toThrow(
      "must not contain a dot",
    );
  });

  it("follows the prefix, and no role but setup may create or delete streams", () => {
    for (const role of PERMISSION_ROLES) {
      const p = rolePermissions(role, {
        prefix: "acme.prod",
        ...(role === "frontend" ? { tenant: "t" } : {}),
      });
      for (const subject of p.publish.allow) {
        expect(subject).not.toMatch(/^toolmesh\./);
        // The MCP bridge creates its bucket of pinned tool approvals, which setup does not.
        if (role === "setup" || subject === "$JS.API.STREAM.CREATE.KV_acme_prod_tool_approvals") {
          continue;
        }
        expect(subject).not.toMatch(/STREAM\.(CREATE|UPDATE|DELETE|PURGE)/);
      }
    }
  });

  it("puts the mesh, each tenant and each owner in an account, each export for one account", () => {
    const config = renderAccountConfig({
      tenants: ["acme", "globex"],
      owners: { "tools-a": ["a.one", "a.two"] },
    });
    for (const account of ["TOOLMESH", "TENANT_acme", "TENANT_globex", "OWNER_tools-a"]) {
      expect(config).toContain(`\n  ${account}: {\n`);
    }
    // JetStream lives in the mesh account only.
    expect(config.match(/jetstream: enabled/g)).toHaveLength(1);
    expect(config.match(/jetstream: disabled/g)).toHaveLength(3);
    const exports = [...config.matchAll(/\{ (service|stream): "([^"]+)", accounts: \[([^\]]+)\]/g)];
    const imports = [
      ...config.matchAll(
        /\{ (service|stream): \{ account: TOOLMESH, subject: "([^"]+)" \}(?:, to: "[^"]+")? \}/g,
      ),
    ];
    expect(exports.length).toBe(imports.length);
    for (const [, kind, subject, accounts] of exports) {
      expect(accounts, subject).not.toContain(",");
      // A tenant's or owner's crossing names that tenant or owner, and is imported once.
      if (accounts!.startsWith("TENANT_")) expect(subject).toContain(accounts!.slice(7));
      expect(imports.filter((i) => i[1] === kind && i[2] === subject)).toHaveLength(1);
    }
    // Each named tool's work consumer on the shared work stream, and nothing wider.
    expect(config).toContain(
      '{ service: "$JS.API.CONSUMER.MSG.NEXT.TOOLMESH_WORK.work_a=2eone", accounts: [OWNER_tools-a], response_type: stream }',
    );
    expect(config).toContain(
      '{ service: "$JS.ACK.TOOLMESH_WORK.work_a=2etwo.>", accounts: [OWNER_tools-a] }',
    );
    const owner = config.slice(config.indexOf("OWNER_tools-a: {"));
    expect(owner).toContain("work_a=2eone");
    expect(owner).not.toMatch(/TOOLMESH_WORK(\.\*|\.>|_)/);
    for (const [, , subject] of exports) expect(subject).not.toMatch(/TOOLMESH_WORK\.(\*|>)/);
    // An account without JetStream answers $JS.API itself: owners import it under {p}.js.API.
    expect(config).toContain(
      '{ service: { account: TOOLMESH, subject: "$JS.API.CONSUMER.INFO.TOOLMESH_WORK.work_a=2eone" }, to: "toolmesh.js.API.CONSUMER.INFO.TOOLMESH_WORK.work_a=2eone" }',
    );
    // The mesh's own users: the trusted services, and an executor and bridge trusted like them.
    const mesh = config.slice(config.indexOf("TOOLMESH: {"), config.indexOf("TENANT_acme: {"));
    expect([...mesh.matchAll(/user: "([^"]+)"/g)].map((m) => m[1])).toEqual([
      "resolver",
      "schema-expander",
      "gateway",
      "operator",
      "setup",
      "executor",
      "mcp-bridge",
    ]);
    expect(tenantAccount("acme")).toBe("TENANT_acme");
    const prefixed = renderAccountConfig({ prefix: "acme.prod", owners: { x: ["t"] } });
    expect(prefixed).not.toMatch(/"toolmesh\.|TOOLMESH_(CALLS|WORK|SESSIONS)|KV_toolmesh/);
    expect(prefixed).toContain('to: "acme.prod.js.API.CONSUMER.INFO.ACME_PROD_WORK.work_t"');
    // Without owners, no owner account: executors and bridges are the mesh's users.
    expect(renderAccountConfig()).not.toContain("OWNER_");
  });

  it("refuses tenant and owner ids that cannot name an account, saying which", () => {
    expect(() => renderAccountConfig({ tenants: ["a.b"] })).toThrow('tenant id "a.b" must be');
    expect(() => renderAccountConfig({ owners: { "": ["t"] } })).toThrow('owner id "" must be');
    expect(() => renderAccountConfig({ owners: { x: ["t"], X: ["u"] } })).toThrow(
      "differ only in case",
    );
  });

  it("refuses an owner's tool that is not named one by one, or named by two owners", () => {
    expect(() => renderAccountConfig({ owners: { search: ["web.*"] } })).toThrow(
      'owner "search" names "web.*": name each tool (an MCP bridge\'s too, as server.tool)',
    );
    expect(() => renderAccountConfig({ owners: { search: ["web.get", ">"] } })).toThrow(
      "a new tool needs a regenerated configuration and a reload",
    );
    expect(() => renderAccountConfig({ owners: { search: [] } })).toThrow(
      'owner "search" names no tool',
    );
    expect(() => renderAccountConfig({ owners: { a: ["t"], b: ["t"] } })).toThrow(
      'tool "t" is named by owners "a" and "b"',
    );
    expect(() =>
      renderAccountConfig({
        extraUsers: [{ account: "TENANT_nope", user: "u", permissions: rolePermissions("setup") }],
      }),
    ).toThrow("no account TENANT_nope for user u");
  });

  it("gives an owner's executor its owner's crossings only, and refuses an empty tenant", () => {
    const owned = rolePermissions("executor", { owner: "acme", tools: ["acme.run"] });
    for (const subject of owned.publish.allow) {
      expect(subject).toMatch(/TOOLMESH_WORK\.work_acme=2erun|toolmesh\.v1\.owner\.acme\./);
    }
    expect(() => rolePermissions("executor", { owner: "acme" })).toThrow("--owner needs --tools");
    expect(() => rolePermissions("mcp-bridge", { owner: "acme", tools: ["fs.*"] })).toThrow(
      'owner "acme" names "fs.*"',
    );
    expect(() => rolePermissions("resolver", { owner: "acme" })).toThrow("--owner is for");
    expect(() => rolePermissions("frontend", { tenant: "" })).toThrow("--tenant must not be empty");
  });
});
