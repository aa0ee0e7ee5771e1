// The container image (deploy/Dockerfile), the docker-compose stack (docker-compose.yml: NATS
// with the accounts of deploy/nats/toolmesh.conf, `toolmesh setup`, every service and the MCP
// gateway) and the examples of shipping tools (examples/deploy), with a real Docker engine.
// Skipped, loudly, when no engine answers; CI starts one (.ci/run).
//
// Base images come from variables, so the tests run where no registry is reachable:
// TOOLMESH_TEST_NODE_IMAGE (the Dockerfile's NODE_IMAGE; default its own public default) and
// TOOLMESH_TEST_NATS_IMAGE (default nats:2.15.1-alpine, as docker-compose.yml); test/docker/build-base-images.sh makes
// local ones. TOOLMESH_TEST_IMAGE is the tag the image is built under (default toolmesh:test).
import { randomBytes } from "node:crypto";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { connect } from "@nats-io/transport-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parse } from "yaml";
import { mcpClient } from "../helpers/gateway.js";
import {
  startOtlpReceiver,
  type CollectedSpan,
  type OtlpReceiver,
} from "../helpers/otlp-receiver.js";
import {
  buildProjectImage,
  command,
  composeCommand,
  dockerEngine,
  mustRun,
  repoRoot,
  waitUntil,
  type CommandResult,
} from "./docker.js";

const engine = await dockerEngine();
if (!engine.ok) {
  const bar = "!".repeat(100);
  console.warn(
    `\n${bar}\n!! DOCKER TESTS NOT RUN: no Docker engine answers (${engine.why}).\n` +
      `!! The container image, the docker-compose stack and the image examples were NOT verified.\n${bar}\n`,
  );
}

const IMAGE = process.env.TOOLMESH_TEST_IMAGE ?? "toolmesh:test";
const NODE_IMAGE = process.env.TOOLMESH_TEST_NODE_IMAGE;
const NATS_IMAGE = process.env.TOOLMESH_TEST_NATS_IMAGE ?? "nats:2.15.1-alpine";
const BUILD_MS = 20 * 60_000;
const SERVICES = ["nats", "resolver", "executor", "schema-expander", "mcp-bridge", "gateway"];
/** The NATS users of the stack (deploy/nats/toolmesh.conf) and their password variables. */
const USERS = {
  resolver: "TOOLMESH_RESOLVER_PASSWORD",
  "schema-expander": "TOOLMESH_SCHEMA_EXPANDER_PASSWORD",
  gateway: "TOOLMESH_GATEWAY_PASSWORD",
  operator: "TOOLMESH_OPERATOR_PASSWORD",
  setup: "TOOLMESH_SETUP_PASSWORD",
  executor: "TOOLMESH_EXECUTOR_PASSWORD",
  "mcp-bridge": "TOOLMESH_MCP_BRIDGE_PASSWORD",
  "frontend-default": "TOOLMESH_FRONTEND_DEFAULT_PASSWORD",
} as const;
/** A password or key no default of the compose file has: the stack must pass it through. */
const secret = (): string => randomBytes(12).toString("hex");

async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as { port: number };
  await new Promise((resolve) => server.close(resolve));
  return port;
}

describe.skipIf(!engine.ok)("container image and docker-compose stack", () => {
  const project = `toolmesh-test-${process.pid}`;
  const network = `${project}_default`;
  const extraContainers: string[] = [];
  let compose: [string, ...string[]];
  let composeEnv: Record<string, string>;
  let composeFiles: string[];
  let tmp: string;
  let receiver: OtlpReceiver;

  const composeRun = (args: string[], timeoutMs = 120_000): Promise<CommandResult> =>
    command(compose[0], [...compose.slice(1), ...composeFiles, ...args], {
      env: composeEnv,
      timeoutMs,
    });
  const cli = (args: string[]) => composeRun(["run", "--rm", "-T", "cli", ...args]);
  const operator = (args: string[]) => composeRun(["run", "--rm", "-T", "operator", ...args]);
  const natsUrl = () => `nats://127.0.0.1:${composeEnv.NATS_PORT}`;
  const gatewayUrl = () => `http://127.0.0.1:${composeEnv.GATEWAY_PORT}/mcp`;
  const containerOf = async (service: string) =>
    (await composeRun(["ps", "-q", service])).stdout.trim();
  const inspect = async (container: string, format: string) =>
    (await command("docker", ["inspect", "-f", format, container])).stdout.trim();
  const logsOf = async (container: string) => {
    const logs = await command("docker", ["logs", "--tail", "40", container]);
    return logs.stdout + logs.stderr;
  };

  const waitForLog = (container: string, text: string) =>
    waitUntil(
      async () => ((await logsOf(container)).includes(text) ? true : undefined),
      120_000,
      async () => `${container} never logged "${text}":\n${await logsOf(container)}`,
    );

  /** An executor container on the stack's network, from `image`, with `args` for docker run. */
  const startExecutor = async (name: string, image: string, args: string[], toolsDir?: string) => {
    const container = `${project}-${name}`;
    await mustRun("docker", [
      "run",
      "-d",
      "--name",
      container,
      "--network",
      network,
      "--read-only",
      "--tmpfs",
      "/tmp",
      "-e",
      "NATS_URL=nats://nats:4222",
      "-e",
      "NATS_USER=executor",
      "-e",
      `NATS_PASSWORD=${composeEnv[USERS.executor]}`,
      "-e",
      `TOOLMESH_EXECUTOR_OWNER=${name}`,
      ...args,
      image,
      "serve",
      "executor",
      ...(toolsDir ? ["--tools-dir", toolsDir] : []),
    ]);
    extraContainers.push(container);
    await waitForLog(container, '"msg":"executor started"');
    return container;
  };

  beforeAll(async () => {
    tmp = await mkdtemp(join(tmpdir(), "toolmesh-docker-"));
    receiver = await startOtlpReceiver("0.0.0.0");
    compose = await composeCommand();
    await buildProjectImage();

    // Test-only additions: containers reach the test's OTLP receiver on the host.
    const override = join(tmp, "docker-compose.test.yml");
    const hosts = { extra_hosts: ["host.docker.internal:host-gateway"] };
    await writeFile(
      override,
      JSON.stringify({
        services: Object.fromEntries(
          ["resolver", "executor", "schema-expander", "mcp-bridge", "gateway", "cli"].map((s) => [
            s,
            hosts,
          ]),
        ),
      }),
    );
    composeFiles = ["-p", project, "-f", join(repoRoot, "docker-compose.yml"), "-f", override];
    composeEnv = {
      NATS_IMAGE,
      TOOLMESH_IMAGE: IMAGE,
      NATS_PORT: String(await freePort()),
      NATS_MONITOR_PORT: String(await freePort()),
      GATEWAY_PORT: String(await freePort()),
      TOOLMESH_GATEWAY_DEV_KEY: secret(),
      ...Object.fromEntries(Object.values(USERS).map((v) => [v, secret()])),
      OTEL_EXPORTER_OTLP_ENDPOINT: `http://host.docker.internal:${new URL(receiver.url).port}`,
      ...(NODE_IMAGE ? { NODE_IMAGE } : {}),
    };
    const up = await composeRun(["up", "-d"], 300_000);
    if (up.code !== 0) throw new Error(`compose up failed:\n${up.stdout}\n${up.stderr}`);
    const setup = await containerOf("setup");
    expect(await inspect(setup, "{{.State.ExitCode}}"), await logsOf(setup)).toBe("0");
    for (const service of SERVICES) {
      const container = await containerOf(service);
      await waitUntil(
        async () =>
          (await inspect(container, "{{.State.Health.Status}}")) === "healthy" ? true : undefined,
        180_000,
        async () => `${service} never became healthy:\n${await logsOf(container)}`,
      );
    }
  }, BUILD_MS * 2);

  afterAll(async () => {
    for (const container of extraContainers) await command("docker", ["rm", "-f", container]);
    if (composeFiles) await composeRun(["down", "-v", "--remove-orphans"], 180_000);
    await receiver?.close();
    if (tmp) await rm(tmp, { recursive: true, force: true });
  }, 300_000);

  it("runs as a non-root user with toolmesh as entrypoint and on the PATH", async () => {
    expect(await inspect(IMAGE, "{{.Config.User}}")).toBe("1000:1000");
    expect(await inspect(IMAGE, "{{json .Config.Entrypoint}}")).toBe('["toolmesh"]');
    const onPath = await mustRun("docker", [
      "run",
      "--rm",
      "--read-only",
      "--entrypoint",
      "sh",
      IMAGE,
      "-c",
      "command -v toolmesh",
    ]);
    expect(onPath.trim()).toBe("/usr/local/bin/toolmesh");
    const help = await mustRun("docker", ["run", "--rm", "--read-only", IMAGE, "serve", "--help"]);
    expect(help).toContain("run one or more actors");
  });

  it("lets tools mounted anywhere import @toolmesh/executor, @toolmesh/protocol and zod", async () => {
    const tools = join(repoRoot, "examples/deploy/own-tools-image/tools");
    const out = await mustRun("docker", [
      "run",
      "--rm",
      "--read-only",
      "-v",
      `${tools}:/etc/toolmesh/tools:ro`,
      "--entrypoint",
      "node",
      IMAGE,
      "--input-type=module",
      "-e",
      'const m = await import("/etc/toolmesh/tools/word-count.mjs"); console.log(m.default.name);',
    ]);
    expect(out.trim()).toBe("word_count");
  });

  it("answers a call made through the stack", async () => {
    const result = await cli(["call", "echo", "--args", '{"text":"hi"}', "--session", "docker-1"]);
    expect(result.stderr).not.toContain("toolmesh:");
    expect(result.stdout.trim()).toBe("hi");
    expect(result.code).toBe(0);
  });

  it("serves the MCP example server's tools through the bridge", async () => {
    const result = await cli(["call", "everything.get-sum", "--args", '{"a":2,"b":3}']);
    expect(result.stdout).toContain("The sum of 2 and 3 is 5");
    expect(result.code).toBe(0);
  });

  it("reads tool sets and agents from the mounted config folder", async () => {
    const result = await cli(["catalog", "--agent", "assistant", "--json"]);
    expect(result.code).toBe(0);
    const catalog = JSON.parse(result.stdout) as { tools: { name: string }[] };
    expect(catalog.tools.map((t) => t.name)).toEqual(
      expect.arrayContaining(["echo", "everything.get-sum"]),
    );
  });

  it("sends the services' spans to the OTLP endpoint", async () => {
    await cli(["call", "echo", "--args", '{"text":"traced"}', "--session", "docker-trace"]);
    const chainOf = (spans: CollectedSpan[]): string[] => {
      const processed = spans.find(
        (s) => s.name === "process echo" && s.service === "toolmesh-executor",
      );
      const parent = spans.find((s) => s.spanId === processed?.parentSpanId);
      return processed && parent
        ? [`${processed.service}:${processed.name}`, `${parent.service}:${parent.name}`]
        : [];
    };
    const spans = await receiver.waitFor((s) => chainOf(s).length === 2, 30_000);
    expect(chainOf(spans)).toEqual(["toolmesh-executor:process echo", "toolmesh-resolver:resolve"]);
  });

  it("runs the tools of an image built FROM toolmesh (examples/deploy/own-tools-image)", async () => {
    const dir = join(repoRoot, "examples/deploy/own-tools-image");
    const dockerfile = await readFile(join(dir, "Dockerfile"), "utf8");
    // The Dockerfile is the README's snippet; it is built the way the README says, on the
    // toolmesh image named by a build argument.
    expect(
      dockerfile
        .trim()
        .split("\n")
        .filter((line) => !line.startsWith("#")),
    ).toEqual([
      "ARG TOOLMESH_IMAGE=toolmesh",
      "FROM ${TOOLMESH_IMAGE}",
      "COPY tools/ /app/tools/custom/",
    ]);
    const tag = `${IMAGE}-own-tools`;
    await mustRun("docker", ["build", "--build-arg", `TOOLMESH_IMAGE=${IMAGE}`, "-t", tag, dir], {
      timeoutMs: BUILD_MS,
    });
    await startExecutor("text", tag, [], "/app/tools/custom");
    const counted = await cli([
      "call",
      "word_count",
      "--args",
      '{"text":"one two three","min_length":3}',
    ]);
    expect(counted.stdout.trim()).toBe("3");
    const empty = await cli(["call", "word_count", "--args", '{"text":" "}']);
    expect(empty.code).toBe(1);
    expect(empty.stdout).toContain("the text is empty");
  });

  it("runs plain-object and native tools from mounted folders, without an image build", async () => {
    const mounted = join(repoRoot, "examples/deploy/mounted");
    await startExecutor("mounted", IMAGE, [
      "-v",
      `${mounted}/tools:/etc/toolmesh/tools:ro`,
      "-v",
      `${mounted}/native:/etc/toolmesh/native:ro`,
      "-e",
      "TOOLMESH_TOOLS_DIR=/etc/toolmesh/tools",
      "-e",
      "TOOLMESH_NATIVE_TOOLS_DIR=/etc/toolmesh/native",
      "-e",
      "STATUS_API_TOKEN=not-a-real-token",
    ]);
    const shout = await cli(["call", "shout", "--args", '{"text":"hi"}']);
    expect(shout.stdout.trim()).toBe("HI!");
    const listed = await operator(["tools", "list"]);
    expect(listed.stdout).toContain("service_status");
  });

  it("runs NATS with the generated accounts: every role its own user, tenants kept out of the mesh", async () => {
    // No credentials, a wrong password: refused.
    await expect(connect({ servers: natsUrl(), reconnect: false })).rejects.toThrow(
      /Authorization/i,
    );
    await expect(
      connect({ servers: natsUrl(), reconnect: false, user: "resolver", pass: "wrong" }),
    ).rejects.toThrow(/Authorization/i);
    // The tenant's frontend lives in TENANT_default, without JetStream and with rights to the
    // mesh's imports only: asking for a stream of the mesh is refused.
    const frontend = await connect({
      servers: natsUrl(),
      reconnect: false,
      user: "frontend-default",
      pass: composeEnv[USERS["frontend-default"]],
      inboxPrefix: "_INBOX.toolmesh.frontend.default",
    });
    await expect(
      frontend.request("$JS.API.STREAM.INFO.TOOLMESH_CALLS", "", { timeout: 2_000 }),
    ).rejects.toThrow(/Permissions Violation/);
    await frontend.close();
    // The operator commands need the mesh account: as the frontend, `tools list` fails.
    const asFrontend = await cli(["tools", "list"]);
    expect(asFrontend.code).not.toBe(0);
    expect((await operator(["tools", "list"])).stdout).toContain("echo");
  });

  it("keeps each default password the same for NATS and the service that uses it", async () => {
    // What `docker compose up` runs without any variable set (the README's two commands).
    const defaults = Object.fromEntries(Object.values(USERS).map((v) => [v, ""]));
    const config = await command(
      compose[0],
      [
        ...compose.slice(1),
        "-f",
        join(repoRoot, "docker-compose.yml"),
        "--profile",
        "cli",
        "config",
      ],
      { env: { ...defaults, TOOLMESH_GATEWAY_DEV_KEY: "" } },
    );
    expect(config.code, config.stderr).toBe(0);
    const services = (
      parse(config.stdout) as {
        services: Record<string, { environment?: Record<string, string> }>;
      }
    ).services;
    const natsEnv = services.nats?.environment ?? {};
    const used = new Set<string>();
    for (const [name, s] of Object.entries(services)) {
      const user = s.environment?.NATS_USER as keyof typeof USERS | undefined;
      if (user === undefined) continue;
      used.add(user);
      expect(s.environment?.NATS_PASSWORD, `${name} as ${user}`).toBe(natsEnv[USERS[user]]);
      expect(natsEnv[USERS[user]], user).not.toBe("");
    }
    expect([...used].sort()).toEqual(Object.keys(USERS).sort());
    expect(services.gateway?.environment?.TOOLMESH_GATEWAY_DEV_KEY).not.toBe("");
  });

  it("serves MCP clients through the gateway: the catalog and a call, with the stack's key", async () => {
    const res = await fetch(gatewayUrl(), {
      method: "POST",
      headers: { authorization: "Bearer not-the-key", "content-type": "application/json" },
      body: "{}",
    });
    expect(res.status).toBe(401);
    const client = await mcpClient(gatewayUrl(), composeEnv.TOOLMESH_GATEWAY_DEV_KEY);
    try {
      const { tools } = await client.listTools();
      expect(tools.map((t) => t.name)).toEqual(
        expect.arrayContaining(["echo", "everything.get-sum"]),
      );
      const echoed = await client.callTool({ name: "echo", arguments: { text: "via mcp" } });
      expect(echoed.isError ?? false).toBe(false);
      expect(echoed.content).toEqual([{ type: "text", text: "via mcp" }]);
      const sum = await client.callTool({ name: "everything.get-sum", arguments: { a: 2, b: 3 } });
      expect(JSON.stringify(sum.content)).toContain("The sum of 2 and 3 is 5");
    } finally {
      await client.close();
    }
  });

  it("runs docs/first-call-python.md's compose variant as written", async () => {
    const page = await readFile(join(repoRoot, "docs", "first-call-python.md"), "utf8");
    const blocks = (language: string): string[] =>
      [...page.matchAll(new RegExp(`\`\`\`${language}\n([\\s\\S]*?)\`\`\``, "g"))].map(
        (m) => m[1] ?? "",
      );
    // The URL and credentials the page names are the compose file's defaults.
    const file = parse(await readFile(join(repoRoot, "docker-compose.yml"), "utf8")) as {
      services: Record<string, { ports?: string[]; environment?: Record<string, string> }>;
    };
    const port = /\$\{NATS_PORT:-(\d+)\}:4222$/.exec(file.services.nats?.ports?.[0] ?? "")?.[1];
    const cliEnv = file.services.cli?.environment ?? {};
    const password = /:-([^}]+)\}$/.exec(cliEnv.NATS_PASSWORD ?? "")?.[1];
    const variant = blocks("sh")[3]?.trim() ?? "";
    expect(variant).toBe(
      `NATS_URL=nats://127.0.0.1:${port} NATS_USER=${cliEnv.NATS_USER} ` +
        `NATS_PASSWORD=${password} \\\n  python first_call.py`,
    );

    // Steps 2 and 3 as the page says, in a virtual environment of the test's own.
    const dir = join(tmp, "first-call");
    await mkdir(dir);
    await writeFile(join(dir, "first_call.py"), blocks("python")[0] ?? "");
    await mustRun("python3", ["-m", "venv", join(dir, "venv")]);
    const inVenv = { PATH: `${join(dir, "venv", "bin")}:${process.env.PATH ?? ""}` };
    const install = blocks("sh")[1]?.trim() ?? "";
    expect(install).toBe("pip install ./clients/python");
    await mustRun("sh", ["-c", install], { env: inVenv, timeoutMs: 300_000 });
    // The variant against this stack: its port and the frontend password it was started with.
    const against = variant
      .replace(`127.0.0.1:${port}`, `127.0.0.1:${composeEnv.NATS_PORT}`)
      .replace(`=${password} `, `=${composeEnv[USERS["frontend-default"]]} `);
    const out = await mustRun("sh", ["-c", `cd "${dir}" && ${against}`], { env: inVenv });
    expect(out).toBe(blocks("text")[1]);
  });

  it("stops a service with docker stop: exit 0 within its grace", async () => {
    const container = await containerOf("executor");
    // 15 s is the compose stop_grace_period; a service killed at its end would exit 137.
    await mustRun("docker", ["stop", "-t", "15", container], { timeoutMs: 60_000 });
    expect(await inspect(container, "{{.State.ExitCode}}")).toBe("0");
    expect(await logsOf(container)).toContain('"msg":"shutting down"');
  });
});
