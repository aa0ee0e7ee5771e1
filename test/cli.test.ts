import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runCli } from "./helpers/cli.js";
import type { CliOutcome } from "./helpers/cli.js";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { fixtureTools, killAllServices, startService, toolAvailable } from "./helpers/mesh.js";
import { freePort } from "@toolmesh/nats-launcher";
import { renderAccountConfig } from "@toolmesh/nats";

let server: NatsServerHandle;
let env: Record<string, string>;

/** Runs the CLI against this file's mesh, with extra variables. */
function toolmesh(args: string[], extraEnv: Record<string, string> = {}): Promise<CliOutcome> {
  return runCli(args, { ...env, ...extraEnv });
}

beforeAll(async () => {
  server = await startNatsServer();
  env = { NATS_URL: server.url, TOOLMESH_TOOLS_DIR: fixtureTools("tools-a") };
  const resolver = await startService("resolver", env);
  await startService("executor", env);
  await toolAvailable(resolver, "inspect");
});

afterAll(async () => {
  await killAllServices();
  await server?.stop();
});

describe("toolmesh CLI", () => {
  it("call --json prints the tool message and exits 0", async () => {
    const { code, stdout } = await toolmesh([
      "call",
      "inspect",
      "--args",
      '{"query":"q"}',
      "--session",
      "cli-1",
      "--json",
    ]);
    expect(code).toBe(0);
    const message = JSON.parse(stdout) as { role: string; content: string; session_id: string };
    expect(message).toMatchObject({ role: "tool", name: "inspect", session_id: "cli-1" });
    expect(JSON.parse(message.content)).toMatchObject({ args: { query: "q", limit: 10 } });
  });

  it("call exits 1 with the typed error when the call fails", async () => {
    const { code, stdout } = await toolmesh(["call", "inspect", "--args", "{oops", "--json"]);
    expect(code).toBe(1);
    expect(JSON.parse(stdout)).toMatchObject({ error: { code: "invalid_arguments" } });
  });

  it("call honours -s/--server over NATS_URL", async () => {
    const { code, stdout } = await toolmesh(["-s", server.url, "call", "whoami", "--json"], {
      NATS_URL: "nats://127.0.0.1:1",
    });
    expect(code).toBe(0);
    expect(JSON.parse(stdout)).toMatchObject({ name: "whoami" });
  });

  it("resolve --json prints the resolved-call record", async () => {
    const { code, stdout } = await toolmesh([
      "resolve",
      "inspect",
      "--args",
      '{"query":"q"}',
      "--json",
    ]);
    expect(code).toBe(0);
    const record = JSON.parse(stdout) as {
      arguments: Record<string, unknown>;
      missing_optional: string[];
    };
    expect(record.arguments).toEqual({
      query: "q",
      limit: 10,
      options: { deep: true, lang: "en" },
    });
    expect(record.missing_optional).toEqual([]);
  });

  it("tools list and show read the registry", async () => {
    const list = await toolmesh(["tools", "list", "--json"]);
    expect(list.code).toBe(0);
    expect((JSON.parse(list.stdout) as { name: string }[]).map((t) => t.name)).toEqual([
      "inspect",
      "misbehave",
      "whoami",
    ]);
    const show = await toolmesh(["tools", "show", "inspect", "--json"]);
    const definition = JSON.parse(show.stdout) as {
      parameters: { properties: Record<string, unknown> };
      preset_params: string[];
    };
    expect(definition.preset_params).toEqual(["token"]);
    expect(Object.keys(definition.parameters.properties)).not.toContain("token");
    const missing = await toolmesh(["tools", "show", "nope", "--json"]);
    expect(missing.code).toBe(1);
  });

  it("refuses a bad configuration value, naming the variable", async () => {
    const { code, stderr } = await toolmesh(["call", "whoami"], {
      TOOLMESH_DEFAULT_TIMEOUT_MS: "soon",
    });
    expect(code).toBe(2);
    expect(stderr).toContain("TOOLMESH_DEFAULT_TIMEOUT_MS");
  });

  it("prints a usage error as one line naming the command's help, and exits 2", async () => {
    const cases: [string[], string][] = [
      [["call", "echo", "--bogus"], "unknown option '--bogus' (see toolmesh call --help)"],
      [["call"], "missing required argument 'tool' (see toolmesh call --help)"],
      [["catalog", "--format", "nope"], "argument 'nope' is invalid"],
      [
        ["cancel", "x"],
        "required option '--session <id>' not specified (see toolmesh cancel --help)",
      ],
      [["call", "echo", "--timeout-ms", "abc"], "must be a positive integer"],
      [["serve", "nope"], "value 'nope' is invalid for argument 'roles'"],
      [["dlq", "show", "abc"], "(see toolmesh dlq show --help)"],
      [["nope"], "unknown command 'nope'"],
    ];
    for (const [args, text] of cases) {
      const { code, stdout, stderr } = await toolmesh(args);
      expect({ args, code, stdout }).toEqual({ args, code: 2, stdout: "" });
      expect(stderr).toMatch(/^toolmesh: [^\n]+\n$/);
      expect(stderr).toContain(text);
    }
  });

  it("still prints the help and the version, and exits 0", async () => {
    for (const args of [["--help"], ["call", "--help"], ["tools", "show", "--help"]]) {
      const { code, stdout } = await toolmesh(args);
      expect({ args, code }).toEqual({ args, code: 0 });
      expect(stdout).toContain("Usage: toolmesh");
    }
    for (const args of [["--version"], ["dlq", "list", "--version"]]) {
      const { code, stdout } = await toolmesh(args);
      expect({ args, code }).toEqual({ args, code: 0 });
      expect(stdout).toMatch(/^\d+\.\d+\.\d+/);
    }
  });

  it("says which audit stream a tenant lacks and what makes it, and exits 2", async () => {
    for (const command of ["tail", "verify"]) {
      const { code, stderr } = await toolmesh(["--tenant", "nobody", "audit", command]);
      expect({ command, code }).toEqual({ command, code: 2 });
      expect(stderr).toBe(
        "toolmesh: tenant nobody has no audit stream TOOLMESH_AUDIT_nobody: `toolmesh setup " +
          "--tenants nobody` makes it, beside the tenant's calls stream; services record into " +
          "it with TOOLMESH_AUDIT=required (docs/audit.md)\n",
      );
    }
  });

  it("says a NATS host that does not resolve is not found, and exits 2", async () => {
    const { code, stderr } = await toolmesh(["-s", "nats://nosuchhost.invalid:4222", "stats"]);
    expect(code).toBe(2);
    expect(stderr).toBe(
      "toolmesh: cannot connect to NATS at nats://nosuchhost.invalid:4222: host not found\n",
    );
  });

  it("dev starts its own nats-server when none answers and runs the demo", async () => {
    const port = await freePort();
    const { code, stdout } = await toolmesh(["dev", "--exit-after-demo"], {
      NATS_URL: `nats://127.0.0.1:${port}`,
      TOOLMESH_TOOLS_DIR: "tools/builtin",
    });
    expect(stdout).toContain(`no NATS answered at nats://127.0.0.1:${port}; started nats-server`);
    expect(stdout).toContain("demo finished: every call ended as expected");
    expect(code).toBe(0);
  });
});

// The accounts `toolmesh auth config` prints (tenants `default` and `acme`): a tenant's frontend
// user may use its own tenant's subjects only, and no operator's.
describe("toolmesh CLI with a user NATS denies what the command needs", () => {
  let accounts: NatsServerHandle;
  const frontend = (): Record<string, string> => ({
    NATS_URL: accounts.url,
    NATS_USER: "frontend-default",
    NATS_PASSWORD: "pw-frontend-default",
  });

  beforeAll(async () => {
    const config = renderAccountConfig({ tenants: ["default", "acme"] });
    // Each user's password is a variable of the rendered file, read from the server's environment.
    for (const [, user, variable] of config.matchAll(/user: "([^"]+)"\n\s+password: \$(\w+)/g))
      process.env[variable!] = `pw-${user!}`;
    accounts = await startNatsServer({ config: `${config}\n` });
  });

  afterAll(async () => {
    await accounts?.stop();
  });

  it("says an operator's command needs the operator's credentials, and exits 2", async () => {
    for (const args of [["stats"], ["quotas", "list"], ["dlq", "list"]]) {
      const { code, stdout, stderr } = await runCli(args, frontend());
      expect({ args, code, stdout }).toEqual({ args, code: 2, stdout: "" });
      expect(stderr).toMatch(
        /^toolmesh: NATS denied this user \(subscription to "_INBOX\.toolmesh\.operator\.[^"]+"\): this command needs the operator's credentials\n$/,
      );
    }
  });

  it("says at once that the user may not use another tenant's subjects, and exits 2", async () => {
    // The refusal is known as the command connects: the call does not wait out its budget.
    for (const args of [
      ["--tenant", "acme", "call", "echo", "--args", '{"text":"a"}'],
      ["--tenant", "acme", "resolve", "echo"],
      ["--tenant", "acme", "catalog"],
    ]) {
      const { code, stdout, stderr } = await runCli(args, frontend());
      expect({ args, code, stdout }).toEqual({ args, code: 2, stdout: "" });
      expect(stderr).toMatch(
        /^toolmesh: NATS denied this user the subjects of tenant acme \(subscription to "_INBOX\.toolmesh\.frontend\.acme\.[^"]+"\): set --tenant \(TOOLMESH_TENANT\) to the tenant of these credentials, or use tenant acme's frontend credentials\n$/,
      );
    }
  });
});
