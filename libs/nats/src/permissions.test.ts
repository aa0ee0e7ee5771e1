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
    expect(() => rolePermissions("resolver", { tenant: "a" })).toThrow(
      "frontend and approver roles",
    );
    expect(() => rolePermissions("approver")).toThrow("the approver role needs --tenant <id>");
    expect(() => rolePermissions("approver", { tenant: "a", session: "s" })).toThrow(
      "--session is for the frontend role",
    );
    expect(() => rolePermissions("resolver", { tools: ["a"] })).toThrow("--tools is for");
    expect(() => rolePermissions("executor", { tools: ["a.b.*"] })).toThrow(
      "must not contain a dot",
    );
  });

  it("follows the prefix, and no role but setup may create or delete streams", () => {
    for (const role of PERMISSION_ROLES) {
      const p = rolePermissions(role, {
        prefix: "acme.prod",
        ...(role === "frontend" || role === "approver" ? { tenant: "t" } : {}),
        ...(["resolver", "operator", "setup"].includes(role) ? { owners: ["o"] } : {}),
      });
      for (const subject of p.publish.allow) {
        expect(subject).not.toMatch(/^toolmesh\./);
        // The MCP bridge creates its bucket of pinned tool approvals, which setup does not, and
        // the resolver an owner's work stream when the owner registers a tool, adding its
        // advisories to the advisories stream (ADR 0041); the operator purges dead letters.
        if (
          role === "setup" ||
          subject === "$JS.API.STREAM.CREATE.KV_acme_prod_tool_approvals" ||
          (role === "resolver" &&
            /^\$JS\.API\.STREAM\.(CREATE|UPDATE)\.ACME_PROD_WORK_o$/.test(subject)) ||
          (role === "resolver" && subject === "$JS.API.STREAM.UPDATE.ACME_PROD_ADVISORIES") ||
          // `toolmesh dlq purge` (ADR 0051): the dead letters only.
          (role === "operator" && subject === "$JS.API.STREAM.PURGE.ACME_PROD_DLQ")
        ) {
          continue;
        }
        expect(subject).not.toMatch(/STREAM\.(CREATE|UPDATE|DELETE|PURGE)/);
      }
    }
  });

  it("puts the mesh, each tenant and each owner in an account, each export for one account", () => {
    const config = renderAccountConfig({
      tenants: ["acme", "globex"],
      owners: { "tools-a": ["a.one", "gh.*"] },
    });
    for (const account of ["TOOLMESH", "TENANT_acme", "TENANT_globex", "OWNER_tools-a"]) {
      expect(config).toContain(`\n  ${account}: {\n`);
    }
    // JetStream lives in the mesh account and, for its users' secrets only, each owner's.
    expect(config.match(/jetstream: enabled/g)).toHaveLength(2);
    expect(config.match(/jetstream: disabled/g)).toHaveLength(2);
    const exports = [...config.matchAll(/\{ (service|stream): "([^"]+)", accounts: \[([^\]]+)\]/g)];
    const imports = [
      ...config.matchAll(
        /\{ (service|stream): \{ account: TOOLMESH, subject: "([^"]+)" \}(?:, to: "[^"]+")? \}/g,
      ),
    ];
    // One crossing goes the other way: the gateway's deposits of delegation grants, exported by
    // each owner's account to the mesh alone.
    const deposits = exports.filter(([, , , accounts]) => accounts === "TOOLMESH");
    expect(deposits.map(([, , subject]) => subject)).toEqual([
      "toolmesh.v1.delegation.owner.tools-a",
    ]);
    expect(config).toContain(
      '{ service: { account: OWNER_tools-a, subject: "toolmesh.v1.delegation.owner.tools-a" } }',
    );
    expect(exports.length - deposits.length).toBe(imports.length);
    for (const [, kind, subject, accounts] of exports) {
      if (accounts === "TOOLMESH") continue;
      expect(accounts, subject).not.toContain(",");
      // A tenant's or owner's crossing names that tenant or owner, and is imported once.
      if (accounts!.startsWith("TENANT_")) expect(subject).toContain(accounts!.slice(7));
      expect(imports.filter((i) => i[1] === kind && i[2] === subject)).toHaveLength(1);
    }
    // Every work consumer of the owner's own work stream, and nothing of the mesh's.
    expect(config).toContain(
      '{ service: "$JS.API.CONSUMER.MSG.NEXT.TOOLMESH_WORK_tools-a.*", accounts: [OWNER_tools-a], response_type: stream }',
    );
    expect(config).toContain(
      '{ service: "$JS.ACK.TOOLMESH_WORK_tools-a.>", accounts: [OWNER_tools-a] }',
    );
    const owner = config.slice(config.indexOf("OWNER_tools-a: {"));
    expect(owner).not.toMatch(/TOOLMESH_WORK[.]/);
    for (const [, , subject] of exports) expect(subject).not.toMatch(/TOOLMESH_WORK\./);
    // Registration under its own namespace and the names granted to it, one crossing each.
    expect(exports.map((e) => e[2]).filter((subject) => subject!.includes(".register"))).toEqual([
      "toolmesh.v1.owner.tools-a.register.tools-a.*",
      "toolmesh.v1.owner.tools-a.register.a.one",
      "toolmesh.v1.owner.tools-a.register.gh.*",
    ]);
    // An account without JetStream answers $JS.API itself: owners import it under {p}.js.API.
    expect(config).toContain(
      '{ service: { account: TOOLMESH, subject: "$JS.API.CONSUMER.INFO.TOOLMESH_WORK_tools-a.*" }, to: "toolmesh.js.API.CONSUMER.INFO.TOOLMESH_WORK_tools-a.*" }',
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
    const prefixed = renderAccountConfig({ prefix: "acme.prod", owners: { x: [] } });
    expect(prefixed).not.toMatch(/"toolmesh\.|TOOLMESH_(CALLS|WORK|SESSIONS)|KV_toolmesh/);
    expect(prefixed).toContain('to: "acme.prod.js.API.CONSUMER.INFO.ACME_PROD_WORK_x.*"');
    // The resolver manages each owner's work stream, by name.
    const resolver = rolePermissions("resolver", { owners: ["x"] }).publish.allow;
    expect(resolver).toContain("$JS.API.STREAM.CREATE.TOOLMESH_WORK_x");
    expect(resolver).toContain("$JS.API.CONSUMER.CREATE.TOOLMESH_WORK_x.*");
    expect(resolver.filter((subject) => subject.includes("TOOLMESH_WORK_"))).not.toContainEqual(
      expect.stringMatching(/TOOLMESH_WORK_[^x]/),
    );
    // Without owners, no owner account: executors and bridges are the mesh's users.
    expect(renderAccountConfig()).not.toContain("OWNER_");
  });

  it("stores each tenant account's calls in its own calls stream, which only the mesh's services reach", () => {
    const config = renderAccountConfig({ tenants: ["acme", "globex"] });
    // The tenant publishes on the wire's call subjects; the import renames them to its stream's.
    expect(config).toContain(
      '{ service: "toolmesh.v1.tenant-calls.acme.*", accounts: [TENANT_acme] }',
    );
    expect(config).toContain(
      '{ service: { account: TOOLMESH, subject: "toolmesh.v1.tenant-calls.acme.*" }, to: "toolmesh.v1.calls.acme.*" }',
    );
    expect(config).not.toContain('service: "toolmesh.v1.calls.');
    expect(rolePermissions("frontend", { tenant: "acme" }).publish.allow).toContain(
      "toolmesh.v1.calls.acme.*",
    );
    // The resolver reads and acks every listed tenant's stream through its intake, by name.
    const resolver = rolePermissions("resolver", { tenants: ["acme"] });
    expect(resolver.subscribe.allow).toContain("toolmesh.v1.intake");
    expect(resolver.publish.allow).toContain("$JS.ACK.TOOLMESH_CALLS_acme.resolver.>");
    expect(resolver.publish.allow).toContain("$JS.API.STREAM.MSG.DELETE.TOOLMESH_CALLS_acme");
    expect(resolver.publish.allow).not.toContainEqual(
      expect.stringMatching(/STREAM\.(CREATE|UPDATE|DELETE|PURGE)\.TOOLMESH_CALLS_acme/),
    );
    // Setup creates them; the operator reads them and replays their dead letters.
    const setup = rolePermissions("setup", { tenants: ["acme"] }).publish.allow;
    expect(setup).toContain("$JS.API.STREAM.*.TOOLMESH_CALLS_acme");
    const operator = rolePermissions("operator", { tenants: ["acme"] }).publish.allow;
    expect(operator).toContain("toolmesh.v1.tenant-calls.*.*");
    expect(operator).toContain("$JS.API.STREAM.INFO.TOOLMESH_CALLS_acme");
    // The generated mesh users are given every tenant's stream.
    const mesh = config.slice(config.indexOf("TOOLMESH: {"), config.indexOf("TENANT_acme: {"));
    expect(mesh).toContain('"$JS.ACK.TOOLMESH_CALLS_globex.resolver.>"');
    expect(() => rolePermissions("gateway", { tenants: ["acme"] })).toThrow(
      "--tenants is for the resolver, operator and setup roles",
    );
  });

  it("refuses tenant and owner ids that cannot name an account, saying which", () => {
    expect(() => renderAccountConfig({ tenants: ["a.b"] })).toThrow('tenant id "a.b" must be');
    expect(() => renderAccountConfig({ owners: { "": ["t"] } })).toThrow('owner id "" must be');
    expect(() => renderAccountConfig({ owners: { x: ["t"], X: ["u"] } })).toThrow(
      "differ only in case",
    );
  });

  it("refuses a name granted to two owners, or a grant that is no name", () => {
    expect(() => renderAccountConfig({ owners: { search: ["web.get", ">"] } })).toThrow(
      'owner "search" is granted ">": grant a tool name, or a namespace as ns.*',
    );
    expect(() => renderAccountConfig({ owners: { search: ["a.b.*"] } })).toThrow(
      'tool namespace "a.b" must not contain a dot',
    );
    expect(() => renderAccountConfig({ owners: { a: ["t"], b: ["t"] } })).toThrow(
      'owners "a" and "b" are both granted names of registry key t',
    );
    // A name within another owner's namespace, or a namespace over another's name.
    expect(() => renderAccountConfig({ owners: { a: [], b: ["a.x"] } })).toThrow(
      'owners "a" and "b" are both granted names of registry key a.x',
    );
    expect(() => renderAccountConfig({ owners: { a: ["gh.issue"], b: ["gh.*"] } })).toThrow(
      'owners "a" and "b" are both granted names of registry key gh.*',
    );
    expect(renderAccountConfig({ owners: { a: ["gh.*"], b: ["ghx.*", "a"] } })).toContain(
      "OWNER_b",
    );
    expect(() =>
      renderAccountConfig({
        extraUsers: [{ account: "TENANT_nope", user: "u", permissions: rolePermissions("setup") }],
      }),
    ).toThrow("no account TENANT_nope for user u");
  });

  it("gives an owner's executor its owner's crossings only, and refuses an empty tenant", () => {
    const owned = rolePermissions("executor", { owner: "acme" });
    // Besides its crossings, only its own account's bucket of users' secrets: made when missing
    // (its account's JetStream info, and creating that one stream), read, and written for
    // delegation grants and cached tokens only (keys of five and four tokens), with the replies
    // to the deposits that crossed into its account.
    for (const subject of owned.publish.allow) {
      expect(subject).toMatch(
        /TOOLMESH_WORK_acme\.|toolmesh\.v1\.owner\.acme\.|^\$JS\.API\.INFO$|^\$JS\.(API\.(STREAM\.(INFO|MSG\.GET|CREATE)|DIRECT\.GET|CONSUMER\.(CREATE|DELETE|INFO|MSG\.NEXT))|FC)\.KV_toolmesh_user_secrets(\.|$)|^\$KV\.toolmesh_user_secrets\.\*\.\*\.\*\.(grant\.\*|token)$|^_R_\.>$/,
      );
    }
    expect(owned.subscribe.allow).toContain("toolmesh.v1.delegation.owner.acme");
    expect(owned.publish.allow).not.toContain("$KV.toolmesh_user_secrets.>");
    expect(() => rolePermissions("mcp-bridge", { owner: "acme", tools: ["fs.*"] })).toThrow(
      "grant them with `toolmesh auth config --owner acme=NAME,…`",
    );
    expect(() => rolePermissions("executor", { owners: ["acme"] })).toThrow("--owners is for");
    expect(() => rolePermissions("resolver", { owner: "acme" })).toThrow("--owner is for");
    expect(() => rolePermissions("frontend", { tenant: "" })).toThrow("--tenant must not be empty");
  });
});
