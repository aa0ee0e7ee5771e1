// The README's Helm path as far as a machine without a cluster can follow it: build the image
// (deploy/Dockerfile), render the chart with that image the way the README installs it, then
// run what the chart would run — the setup hook Job, every Deployment's container with its
// args, environment and restricted security settings, and the `helm test` pod's commands —
// as containers against nats-server in a container, and call a tool through them. Skipped,
// loudly, without a Docker engine. Images: TOOLMESH_TEST_NODE_IMAGE, TOOLMESH_TEST_NATS_IMAGE
// (as in compose.test.ts), TOOLMESH_TEST_IMAGE (default toolmesh:test).
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseAllDocuments } from "yaml";
import { helm } from "../helpers/helm.js";
import { command, dockerEngine, mustRun, waitUntil } from "./docker.js";

const engine = await dockerEngine();
if (!engine.ok) console.warn(`!! HELM PATH DOCKER TEST NOT RUN: no Docker engine (${engine.why})`);

const IMAGE = process.env.TOOLMESH_TEST_IMAGE ?? "toolmesh:test";
const NODE_IMAGE = process.env.TOOLMESH_TEST_NODE_IMAGE;
const NATS_IMAGE = process.env.TOOLMESH_TEST_NATS_IMAGE ?? "nats:2.15.1-alpine";
type Manifest = Record<string, any>;

describe.skipIf(!engine.ok)("the README's Helm path, in containers", () => {
  const network = `toolmesh-helm-path-${process.pid}`;
  const containers: string[] = [];
  let manifests: Manifest[];

  /** `docker run` arguments of a rendered container: its env, restricted like the pod. */
  const runArgs = (c: Manifest, pod: Manifest): string[] => {
    const env = (c.env as Manifest[]).flatMap((e) => {
      if (e.value === undefined) throw new Error(`${e.name as string} comes from a Secret`);
      return ["-e", `${e.name as string}=${e.value as string}`];
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
      c.image as string,
      ...(c.args as string[]),
    ];
  };

  beforeAll(async () => {
    const buildArgs = NODE_IMAGE ? ["--build-arg", `NODE_IMAGE=${NODE_IMAGE}`] : [];
    await mustRun("docker", ["build", "-f", "deploy/Dockerfile", ...buildArgs, "-t", IMAGE, "."], {
      timeoutMs: 20 * 60_000,
    });
    const [repository, tag] = IMAGE.split(":") as [string, string];
    const rendered = await helm([
      "template",
      "toolmesh",
      "helm/toolmesh",
      "--set",
      `image.repository=${repository}`,
      "--set",
      `image.tag=${tag}`,
      "--set",
      "nats.url=nats://nats:4222",
      "--set",
      "setup.enabled=true",
      "--set",
      "setup.credentials.type=none",
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
        "toolmesh-executor-builtin",
      ]);
      for (const d of deployments) {
        const pod = d.spec.template.spec as Manifest;
        const name = `${network}-${d.metadata.name as string}`;
        containers.push(name);
        await mustRun("docker", ["run", "-d", "--name", name, ...runArgs(pod.containers[0], pod)]);
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
      const executor = deployments[2]!.spec.template.spec as Manifest;
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
    },
    5 * 60_000,
  );
});
