import { readFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { PERMISSION_ROLES, renderAccountConfig, rolePermissions } from "./permissions.js";

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
});
