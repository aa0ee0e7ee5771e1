import { describe, expect, it } from "vitest";
import { connectLines } from "./connect-lines.js";

describe("connectLines", () => {
  it("prints the URL and the Python and TypeScript lines for the dev tenant", () => {
    const lines = connectLines({
      nats: { servers: "nats://127.0.0.1:4321" },
      tenant: "default",
      prefix: "toolmesh",
    });
    expect(lines).toEqual([
      "NATS: nats://127.0.0.1:4321 (frontends of tenant default connect with)",
      "  Python:      import toolmesh",
      '               mesh = await toolmesh.connect("nats://127.0.0.1:4321", tenant="default")',
      '  TypeScript:  import { ToolmeshClient } from "@toolmesh/client"; import { connectNats } from "@toolmesh/nats"; import { createSubjects } from "@toolmesh/protocol";',
      '               const client = new ToolmeshClient(await connectNats({ servers: "nats://127.0.0.1:4321", inboxPrefix: createSubjects().frontendInboxPrefix("default") }), { tenant: "default" });',
    ]);
  });

  it("names another prefix and the credential variables, and never prints a secret", () => {
    const lines = connectLines({
      nats: { servers: "nats://ada:s3cret@nats:4222", user: "frontend-acme", password: "pw" },
      tenant: "acme",
      prefix: "staging",
    }).join("\n");
    expect(lines).toContain(
      'toolmesh.connect("nats://***@nats:4222", tenant="acme", prefix="staging")',
    );
    expect(lines).toContain('createSubjects({ prefix: "staging" }).frontendInboxPrefix("acme")');
    expect(lines).toContain('{ tenant: "acme", prefix: "staging" }');
    expect(lines).toContain("with the credentials of NATS_USER, NATS_PASSWORD");
    expect(lines).not.toMatch(/s3cret|"pw"/);
  });
});
