// The README's Helm path as far as a machine without a cluster can follow it: build the image
// (deploy/Dockerfile), render the chart with that image and the README's own `helm install`
// flags (read from README.md: only the image, the NATS address and, on one NATS server rather
// than the README's three, the stream replicas differ), then
// run what the chart would run — the setup hook Job, every Deployment's container with its
// args, environment and restricted security settings, and the `helm test` pod's commands —
// as containers against nats-server in a container, and call a tool through them: with the
// CLI, and with an MCP client through the chart's gateway, with the keys Secret the README
// makes. Skipped,
// loudly, without a Docker engine. Images: TOOLMESH_TEST_NODE_IMAGE, TOOLMESH_TEST_NATS_IMAGE
// (as in compose.test.ts), TOOLMESH_TEST_IMAGE (default toolmesh:test).
import { randomBytes } from "node:crypto";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { keyDigest } from "@toolmesh/gateway";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseAllDocuments } from "yaml";
import { mcpClient } from "../helpers/gateway.js";
import { helm } from "../helpers/helm.js";
import {
  buildProjectImage,
  command,
  dockerEngine,
  mustRun,
  repoRoot,
  waitUntil,
} from "./docker.js";

const engine = await dockerEngine();
if (!engine.ok) console.warn(`!! HELM PATH DOCKER TEST NOT RUN: no Docker engine (${engine.why})`);

const IMAGE = process.env.TOOLMESH_TEST_IMAGE ?? "toolmesh:test";
const NATS_IMAGE = process.env.TOOLMESH_TEST_NATS_IMAGE ?? "nats:2.15.1-alpine";
type Manifest = Record<string, any>;
/** The gateway's API key, in the keys file the README's Secret holds (docs/gateway.md). */
const GATEWAY_KEY = randomBytes(16).toString("hex");
const GATEWAY_KEYS = `keys:\n  - sha256: ${keyDigest(GATEWAY_KEY)}\n    tenant: default\n`;
/** The Secrets the README makes, by name: file name → content. */
const SECRETS: Record<string, Record<string, string>> = {};

/** The README's shell commands of "Kubernetes with Helm", continuation lines joined. */
async function readmeHelmCommands(): Promise<string[]> {
  const readme = await readFile(join(repoRoot, "README.md"), "utf8");
  const section = readme.slice(readme.indexOf("### Kubernetes with Helm"));
  const block = /```sh\n([\s\S]*?)```/.exec(section)?.[1];
  if (block === undefined) throw new Error("README: no sh block under Kubernetes with Helm");
  return block
    .replace(/\\\n\s*/g, "")
    .split("\n")
    .filter((l) => l.trim() !== "");
}

/** `--set` values of a command line: `key=value`, shell quotes removed. */
function setFlags(line: string): Map<string, string> {
  const flags = new Map<string, string>();
  for (const m of line.matchAll(/--set\s+([^=\s]+)=('[^']*'|"[^"]*"|\S+)/g)) {
    flags.set(m[1] as string, (m[2] as string).replace(/^['"]|['"]$/g, ""));
  }
  return flags;
}

describe.skipIf(!engine.ok)("the README's Helm path, in containers", () => {
  const network = `toolmesh-helm-path-${process.pid}`;
  const containers: string[] = [];
  let manifests: Manifest[];
  let secretsDir: string;
  let readmeFlags: Map<string, string>;
  let readmeNatsTag: string | undefined;

  /**
   * `docker run` arguments of a rendered container: its env, its Secret volumes (from
   * {@link SECRETS}, written under `secretsDir`), restricted like the pod.
   */
  const runArgs = (c: Manifest, pod: Manifest): string[] => {
    const env = (c.env as Manifest[]).flatMap((e) => {
      if (e.value === undefined) throw new Error(`${e.name as string} comes from a Secret`);
      return ["-e", `${e.name as string}=${e.value as string}`];
    });
    const mounts = ((c.volumeMounts ?? []) as Manifest[]).flatMap((m) => {
      if (m.mountPath === "/tmp") return []; // the pod's emptyDir: --tmpfs below
      const volume = (pod.volumes as Manifest[]).find((v) => v.name === m.name)!;
      const secret = volume.secret?.secretName as string | undefined;
      if (secret === undefined || SECRETS[secret] === undefined) {
        throw new Error(`volume ${m.name as string} is not a Secret of the test`);
      }
      return ["-v", `${join(secretsDir, secret)}:${m.mountPath as string}:ro`];
    });
    const sc = pod.securityContext as Manifest;
    return [
      "--network",
      network,
      "--user",
      `${sc.runAsUser as number}:${sc.runAsGroup as number}`,
      "--read-only",
      "--tmpfs",
      "/tmp",
      "--cap-drop",
      "ALL",
      "--security-opt",
      "no-new-privileges",
      ...env,
      ...mounts,
      c.image as string,
      ...(c.args as string[]),
    ];
  };

  beforeAll(async () => {
    await buildProjectImage();
    const [repository, tag] = IMAGE.split(":") as [string, string];
    const commands = await readmeHelmCommands();
    const install = commands.find((l) => l.startsWith("helm install toolmesh helm/toolmesh"));
    const natsInstall = commands.find((l) => l.startsWith("helm install nats nats/nats"));
    if (install === undefined || natsInstall === undefined) {
      throw new Error(`README: no helm install of toolmesh and NATS in\n${commands.join("\n")}`);
    }
    readmeFlags = setFlags(install);
    // kubectl create secret generic NAME … --from-file=KEY=FILE: the gateway's keys file.
    for (const line of commands.filter((l) => l.startsWith("kubectl create secret generic "))) {
      const name = line.split(/\s+/)[4] as string;
      const key = /--from-file=([^=\s]+)=/.exec(line)?.[1];
      if (key !== undefined) SECRETS[name] = { [key]: GATEWAY_KEYS };
    }
    readmeNatsTag = setFlags(natsInstall).get("container.image.tag");
    const flags = new Map([
      ...readmeFlags,
      ["image.repository", repository],
      ["image.tag", tag],
      ["nats.url", "nats://nats:4222"],
      ["setup.streamReplicas", "1"], // one NATS server here, three in the README
    ]);
    secretsDir = await mkdtemp(join(tmpdir(), "toolmesh-helm-path-"));
    for (const [name, files] of Object.entries(SECRETS)) {
      await mkdir(join(secretsDir, name), { recursive: true });
      for (const [file, text] of Object.entries(files)) {
        await writeFile(join(secretsDir, name, file), text, { mode: 0o644 });
      }
    }
    const rendered = await helm([
      "template",
      "toolmesh",
      "helm/toolmesh",
      "--namespace",
      "toolmesh",
      ...[...flags].flatMap(([k, v]) => ["--set", `${k}=${v}`]),
    ]);
    expect(rendered.code, rendered.stderr).toBe(0);
    manifests = parseAllDocuments(rendered.stdout)
      .map((d) => d.toJS() as Manifest | null)
      .filter((m): m is Manifest => m !== null);
    await mustRun("docker", ["network", "create", network]);
    const nats = `${network}-nats`;
    containers.push(nats);
    await mustRun("docker", [
      "run",
      "-d",
      "--name",
      nats,
      "--network",
      network,
      "--network-alias",
      "nats",
      NATS_IMAGE,
      "-js",
    ]);
  }, 25 * 60_000);

  afterAll(async () => {
    for (const c of containers) await command("docker", ["rm", "-f", c]);
    await command("docker", ["network", "rm", network]);
    if (secretsDir) await rm(secretsDir, { recursive: true, force: true });
  });

  it("follows the README: its flags, its gateway keys Secret, its NATS version", async () => {
    // The README's flags that the test replaces must be the ones it names.
    expect([...readmeFlags.keys()]).toEqual(
      expect.arrayContaining(["image.repository", "image.tag", "nats.url", "setup.enabled"]),
    );
    // The README runs the gateway, with the keys of the Secret it makes.
    expect(readmeFlags.get("gateway.enabled")).toBe("true");
    expect(Object.keys(SECRETS)).toContain(readmeFlags.get("gateway.keys.existingSecret"));
    // The NATS the test runs is the README's version (helm-production.test.ts holds compose to
    // it too); a local image is tagged major.minor.
    expect(readmeNatsTag).toBeDefined();
    expect(readmeNatsTag?.startsWith(NATS_IMAGE.split(":")[1] ?? "none")).toBe(true);
  });

  it(
    "runs the setup hook, every role until ready, and the helm test commands, then calls a tool",
    async () => {
      const job = manifests.find((m) => m.kind === "Job")!;
      const jobPod = job.spec.template.spec as Manifest;
      const setup = await command(
        "docker",
        ["run", "--rm", ...runArgs(jobPod.containers[0], jobPod)],
        {
          timeoutMs: 120_000,
        },
      );
      expect(setup.code, setup.stderr + setup.stdout).toBe(0);

      const deployments = manifests.filter((m) => m.kind === "Deployment");
      expect(deployments.map((d) => d.metadata.name)).toEqual([
        "toolmesh-resolver",
        "toolmesh-schema-expander",
        "toolmesh-gateway",
        "toolmesh-executor-builtin",
      ]);
      for (const d of deployments) {
        const pod = d.spec.template.spec as Manifest;
        const name = `${network}-${d.metadata.name as string}`;
        containers.push(name);
        // The gateway's port is published, as its Service would expose it.
        const publish = d.metadata.name === "toolmesh-gateway" ? ["-p", "127.0.0.1::8787"] : [];
        await mustRun("docker", [
          "run",
          "-d",
          "--name",
          name,
          ...publish,
          ...runArgs(pod.containers[0], pod),
        ]);
      }
      for (const d of deployments) {
        const c = d.spec.template.spec.containers[0] as Manifest;
        const port = (c.ports as Manifest[]).find((p) => p.name === c.readinessProbe.httpGet.port)!;
        const name = `${network}-${d.metadata.name as string}`;
        const probe = `fetch("http://127.0.0.1:${port.containerPort as number}${c.readinessProbe.httpGet.path as string}").then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))`;
        await waitUntil(
          async () =>
            (await command("docker", ["exec", name, "node", "-e", probe])).code === 0
              ? true
              : undefined,
          90_000,
          async () =>
            `${name} never became ready:\n${(await command("docker", ["logs", name])).stderr}`,
        );
      }

      // What `helm test` runs, in the same way.
      const testPod = manifests.find((m) => m.kind === "Pod")!;
      for (const c of [
        ...((testPod.spec.initContainers ?? []) as Manifest[]),
        ...(testPod.spec.containers as Manifest[]),
      ]) {
        const out = await command("docker", ["run", "--rm", ...runArgs(c, testPod.spec)], {
          timeoutMs: 60_000,
        });
        expect(out.code, out.stderr).toBe(0);
        expect(out.stdout).toContain("echo");
      }
      const executor = deployments.find((d) => d.metadata.name === "toolmesh-executor-builtin")!
        .spec.template.spec as Manifest;
      const call = await command(
        "docker",
        [
          "run",
          "--rm",
          ...runArgs(
            {
              ...executor.containers[0],
              args: ["call", "echo", "--args", '{"text":"through the chart"}'],
            },
            executor,
          ),
        ],
        { timeoutMs: 60_000 },
      );
      expect(call.code, call.stderr).toBe(0);
      expect(call.stdout).toContain("through the chart");

      // An MCP client through the gateway, with the key of its Secret.
      const published = await mustRun("docker", ["port", `${network}-toolmesh-gateway`, "8787"]);
      const port = /:(\d+)\s*$/m.exec(published)?.[1];
      const client = await mcpClient(`http://127.0.0.1:${port}/mcp`, GATEWAY_KEY);
      try {
        const result = await client.callTool({ name: "echo", arguments: { text: "via mcp" } });
        expect(result.content).toEqual([{ type: "text", text: "via mcp" }]);
      } finally {
        await client.close();
      }
    },
    5 * 60_000,
  );
});
