// The NATS side of the chart's "Kubernetes with accounts and TLS" guide (helm/toolmesh/README.md)
// run as written: its commands make the passwords and the accounts file, nats-server starts on
// the file the NATS chart's values include, every user of the guide logs in with its password, and
// a tenant is added by the guide's steps and two reloads. Given the NATS chart's directory in
// TOOLMESH_TEST_NATS_CHART (it is not packaged where CI can install it from), the configuration
// the chart renders from the guide's values is also checked by nats-server itself.
import { execFile } from "node:child_process";
import { copyFile, mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join, posix } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connect } from "@nats-io/transport-node";
import { parse as parseYaml, parseAllDocuments } from "yaml";
import { runCli } from "./helpers/cli.js";
import { helm } from "./helpers/helm.js";
import { startNatsServer, stopAll, type NatsServerHandle } from "./helpers/nats-server.js";
import { createTestPki, type TestPki } from "./helpers/tls.js";

const run = promisify(execFile);
const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
const GUIDE_DIR = join(ROOT, "examples/deploy/nats-accounts-tls");
const readme = await readFile(join(ROOT, "helm/toolmesh/README.md"), "utf8");
const guide = readme.slice(readme.indexOf("## Kubernetes with accounts and TLS"));
const natsValues = parseYaml(await readFile(join(GUIDE_DIR, "nats-values.yaml"), "utf8")) as {
  config: { merge: Record<string, string> };
};
const NATS_CHART = process.env.TOOLMESH_TEST_NATS_CHART;

/** The first `sh` block of the guide after `heading`. */
function shellBlock(heading: string): string {
  const at = guide.indexOf(heading);
  if (at < 0) throw new Error(`the guide has no "${heading}"`);
  const block = /```sh\n([\s\S]*?)```/.exec(guide.slice(at));
  if (block?.[1] === undefined) throw new Error(`no shell block after "${heading}"`);
  return block[1];
}

/** Where the NATS container finds each file the values include, as paths under `etc`. */
function includedFiles(etc: string): string[] {
  return Object.entries(natsValues.config.merge)
    .filter(([key]) => key.endsWith("$include"))
    .map(([, file]) => join(etc, posix.join("/etc/nats-config", file).replace(/^\/etc\//, "")));
}

let work: string;
let etc: string;
let server: NatsServerHandle;
let pki: TestPki;

/** Runs guide commands in `work`; kubectl and helm stand for the cluster and do nothing here. */
async function runGuide(commands: string): Promise<void> {
  const prelude = [
    "set -eu",
    "kubectl() { :; }",
    "helm() { :; }",
    `toolmesh() { node ${JSON.stringify(join(ROOT, "bin/toolmesh.js"))} "$@"; }`,
  ].join("\n");
  await run("bash", ["-c", `${prelude}\n${commands}`], { cwd: work });
}

/** The Secret's keys, mounted where the NATS container reads them (what the kubelet does). */
async function mountSecret(): Promise<void> {
  for (const file of includedFiles(etc)) {
    await mkdir(dirname(file), { recursive: true });
    await copyFile(join(work, posix.basename(file)), file);
  }
}

/**
 * The server's configuration file where the chart puts it, including what the values include
 * (relative to it, as the chart renders them); returns its path.
 */
async function writeServerConfig(): Promise<string> {
  const includes = Object.entries(natsValues.config.merge)
    .filter(([key]) => key.endsWith("$include"))
    .map(([, file]) => `include ${file};`);
  const file = join(etc, "nats-config", "nats.conf");
  await mkdir(dirname(file), { recursive: true });
  await writeFile(file, `${includes.join("\n")}\n`);
  return file;
}

async function password(user: string): Promise<string> {
  const variable = `TOOLMESH_${user.toUpperCase().replace(/-/g, "_")}_PASSWORD`;
  const line = (await readFile(join(work, "secrets.conf"), "utf8"))
    .split("\n")
    .find((l) => l.startsWith(`${variable}:`));
  const value = line === undefined ? undefined : /"(.*)"/.exec(line)?.[1];
  if (value === undefined) throw new Error(`secrets.conf has no ${variable}`);
  return value;
}

async function logsIn(user: string, pass: string): Promise<boolean> {
  try {
    const nc = await connect({ servers: server.url, user, pass, reconnect: false });
    await nc.close();
    return true;
  } catch {
    return false;
  }
}

beforeAll(async () => {
  work = await mkdtemp(join(tmpdir(), "toolmesh-guide-"));
  etc = join(work, "etc");
  pki = await createTestPki();
  await runGuide(shellBlock("**2. The accounts and the passwords, for NATS.**"));
  await mountSecret();
  // Read instead of the launcher's own file (a later -c wins); reloads read it again.
  server = await startNatsServer({
    args: ["-c", await writeServerConfig()],
    ...(process.env.TOOLMESH_TEST_NATS_SERVER
      ? { executable: process.env.TOOLMESH_TEST_NATS_SERVER }
      : {}),
  });
}, 60_000);

afterAll(async () => {
  await stopAll();
  if (pki !== undefined) await rm(pki.dir, { recursive: true, force: true });
  if (work !== undefined) await rm(work, { recursive: true, force: true });
});

describe("the guide's NATS accounts", () => {
  it("start nats-server; each user logs in with its password and no other", async () => {
    const users = /for user in ([^;]+);/.exec(shellBlock("**2. The accounts"))?.[1]?.split(" ");
    expect(users).toContain("resolver");
    for (const user of users ?? []) {
      expect(await logsIn(user, await password(user)), user).toBe(true);
      expect(await logsIn(user, "not-the-password"), user).toBe(false);
    }
    const setup = await runCli(["setup", "--tenants", "default", "--json"], {
      NATS_URL: server.url,
      NATS_USER: "setup",
      NATS_PASSWORD: await password("setup"),
    });
    expect(setup.stderr).toBe("");
    expect(setup.code).toBe(0);
  });

  it("add a tenant by the guide's steps and two reloads", async () => {
    expect(await logsIn("frontend-newco", "anything")).toBe(false);
    await runGuide(shellBlock("**Adding a tenant (two reloads).**"));
    await mountSecret();
    await server.reload("");
    await server.reload("");
    for (const user of ["frontend-newco", "approver-newco", "frontend-default"])
      expect(await logsIn(user, await password(user)), user).toBe(true);
  });

  it.runIf(NATS_CHART !== undefined)(
    "are what the NATS chart renders from the guide's values, a configuration nats-server accepts",
    async () => {
      const rendered = await helm([
        "template",
        "nats",
        NATS_CHART ?? "",
        "-f",
        join(GUIDE_DIR, "nats-values.yaml"),
      ]);
      expect(rendered.stderr).toBe("");
      const configMap = parseAllDocuments(rendered.stdout)
        .map((d) => d.toJS() as { kind?: string; data?: Record<string, string> })
        .find((m) => m.kind === "ConfigMap");
      const text = configMap?.data?.["nats.conf"] ?? "";
      expect(text).toContain("include ../toolmesh-auth/auth.conf;");
      // The container's paths under `etc`, its TLS files from the test's PKI.
      const tls = { "nats-ca-cert/ca.crt": pki.caFile };
      const pairs = { "tls.crt": pki.serverCert, "tls.key": pki.serverKey };
      for (const [file, from] of Object.entries(tls)) {
        await mkdir(dirname(join(etc, file)), { recursive: true });
        await copyFile(from, join(etc, file));
      }
      for (const dir of ["nats-certs/nats", "nats-certs/cluster"])
        for (const [file, from] of Object.entries(pairs)) {
          await mkdir(join(etc, dir), { recursive: true });
          await copyFile(from, join(etc, dir, file));
        }
      await mkdir(join(etc, "nats-config"), { recursive: true });
      const config = join(etc, "nats-config", "nats.conf");
      await writeFile(
        config,
        text
          .replaceAll("/etc/", `${etc}/`)
          .replaceAll('"/data"', JSON.stringify(join(work, "data")))
          .replaceAll("/var/run/nats", work)
          .replace("$SERVER_NAME", '"nats-0"'),
      );
      const binary = process.env.TOOLMESH_TEST_NATS_SERVER ?? "nats-server";
      const checked = await run(binary, ["-t", "-c", config]);
      expect(`${checked.stdout}${checked.stderr}`).toMatch(/is valid/);
    },
  );
});
