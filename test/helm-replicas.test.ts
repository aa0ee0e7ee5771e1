// Turning an autoscaler on keeps a Deployment's replicas: the chart reads the live Deployment with
// `lookup` and renders its count (at least minReplicas), so an upgrade from `mode: none` does not
// reset it to one before the autoscaler acts. `lookup` needs an API server: helm renders here with
// `--dry-run=server` against a minimal stand-in that answers discovery and the Deployments below,
// as the Kubernetes API does (no cluster runs in the tests).
import { once } from "node:events";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { createServer } from "node:http";
import type { Server, ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, expect, it } from "vitest";
import { parseAllDocuments } from "yaml";
import { helm } from "./helpers/helm.js";

type Manifest = Record<string, any>;

/** Live replicas by Deployment name, in namespace `default`. */
const LIVE: Record<string, number> = {
  "t-toolmesh-executor-busy": 5,
  "t-toolmesh-executor-quiet": 1,
};
const KINDS: Record<string, string[]> = {
  v1: ["ConfigMap", "Secret", "Service", "ServiceAccount", "Pod"],
  "apps/v1": ["Deployment"],
  "autoscaling/v2": ["HorizontalPodAutoscaler"],
  "batch/v1": ["Job"],
  "policy/v1": ["PodDisruptionBudget"],
  "networking.k8s.io/v1": ["NetworkPolicy", "Ingress"],
  "keda.sh/v1alpha1": ["ScaledObject"],
};

function answer(url: string, res: ServerResponse): void {
  const send = (code: number, body: unknown): void => {
    res.writeHead(code, { "content-type": "application/json" }).end(JSON.stringify(body));
  };
  const path = url.split("?")[0] ?? "";
  if (path === "/version") return send(200, { major: "1", minor: "31", gitVersion: "v1.31.0" });
  if (path === "/api") return send(200, { kind: "APIVersions", versions: ["v1"] });
  if (path === "/apis") {
    const groups = Object.keys(KINDS)
      .filter((gv) => gv !== "v1")
      .map((groupVersion) => {
        const [name, version] = groupVersion.split("/") as [string, string];
        const v = { groupVersion, version };
        return { name, versions: [v], preferredVersion: v };
      });
    return send(200, { kind: "APIGroupList", apiVersion: "v1", groups });
  }
  const list = /^\/(?:api\/(v1)|apis\/([^/]+\/[^/]+))$/.exec(path);
  if (list) {
    const groupVersion = (list[1] ?? list[2]) as string;
    const resources = (KINDS[groupVersion] ?? []).map((kind) => ({
      name: `${kind.toLowerCase()}s`,
      singularName: kind.toLowerCase(),
      namespaced: true,
      kind,
      verbs: ["get", "list"],
    }));
    return send(200, { kind: "APIResourceList", apiVersion: "v1", groupVersion, resources });
  }
  const name = /^\/apis\/apps\/v1\/namespaces\/default\/deployments\/([^/]+)$/.exec(path)?.[1];
  if (name !== undefined && LIVE[name] !== undefined) {
    return send(200, {
      apiVersion: "apps/v1",
      kind: "Deployment",
      metadata: {
        name,
        namespace: "default",
        labels: { "app.kubernetes.io/managed-by": "Helm" },
        annotations: {
          "meta.helm.sh/release-name": "t",
          "meta.helm.sh/release-namespace": "default",
        },
      },
      spec: { replicas: LIVE[name] },
    });
  }
  send(404, { kind: "Status", apiVersion: "v1", status: "Failure", reason: "NotFound", code: 404 });
}

let api: Server;
let dir: string;
let kubeconfig: string;

beforeAll(async () => {
  api = createServer((req, res) => answer(req.url ?? "/", res));
  api.listen(0, "127.0.0.1");
  await once(api, "listening");
  const { port } = api.address() as AddressInfo;
  dir = await mkdtemp(join(tmpdir(), "toolmesh-kube-"));
  kubeconfig = join(dir, "config");
  await writeFile(
    kubeconfig,
    [
      "apiVersion: v1",
      "kind: Config",
      `clusters: [{name: api, cluster: {server: "http://127.0.0.1:${port}"}}]`,
      "users: [{name: user, user: {}}]",
      "contexts: [{name: api, context: {cluster: api, user: user, namespace: default}}]",
      "current-context: api",
      "",
    ].join("\n"),
  );
});

afterAll(async () => {
  api?.close();
  if (dir !== undefined) await rm(dir, { recursive: true, force: true });
});

async function renderAgainstApi(executors: unknown[]): Promise<Map<string, unknown>> {
  const args = ["template", "t", "helm/toolmesh", "--dry-run=server"];
  const result = await helm(
    [
      ...args,
      "--disable-openapi-validation",
      "--set-json",
      `executors=${JSON.stringify(executors)}`,
    ],
    { KUBECONFIG: kubeconfig },
  );
  expect(result.stderr).toBe("");
  expect(result.code).toBe(0);
  const deployments = parseAllDocuments(result.stdout)
    .map((d) => d.toJS() as Manifest | null)
    .filter((m): m is Manifest => m?.kind === "Deployment");
  return new Map(deployments.map((d) => [d.metadata.name as string, d.spec.replicas]));
}

const hpa = (name: string, minReplicas: number) => ({
  name,
  replicas: 1,
  resources: { requests: { cpu: "100m" } },
  autoscaling: { mode: "hpa", minReplicas, maxReplicas: 10 },
});

it("keeps the live replica count, at least minReplicas, when an autoscaler takes a Deployment over", async () => {
  const replicas = await renderAgainstApi([
    hpa("busy", 2),
    hpa("quiet", 3),
    hpa("new", 2),
    { name: "fixed", replicas: 4 },
  ]);
  expect(replicas.get("t-toolmesh-executor-busy")).toBe(5); // not 1: the live count
  expect(replicas.get("t-toolmesh-executor-quiet")).toBe(3); // raised to minReplicas
  expect(replicas.get("t-toolmesh-executor-new")).toBeUndefined(); // new: the autoscaler's
  expect(replicas.get("t-toolmesh-executor-fixed")).toBe(4); // mode none: the value
}, 60_000);
