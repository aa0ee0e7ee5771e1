// What a platform team needs from the chart before production, each point rendered with the
// real helm binary: NATS TLS and credentials per role, owners from Secrets, HPA with CPU
// requests, KEDA on a clustered NATS, Prometheus Operator monitors, per-role placement,
// identity and image, stream replicas, a checksum that ignores replicas, names that cannot
// collide, PDBs that never block drains, the gateway, NetworkPolicies, `helm test`, NOTES.
// Every object of a matrix of values is checked against the Kubernetes API types with unknown
// fields refused (test/helpers/k8s-strict.ts).
import { readFileSync } from "node:fs";
import { Ajv } from "ajv";
import { describe, expect, it } from "vitest";
import { parseAllDocuments } from "yaml";
import { helm } from "./helpers/helm.js";
import { hasStrictType, strictProblems } from "./helpers/k8s-strict.js";

const CHART = "helm/toolmesh";
const FULL = `${CHART}/ci/full-values.yaml`;
type Manifest = Record<string, any>;

async function render(args: string[], release = "t"): Promise<Manifest[]> {
  const result = await helm(["template", release, CHART, ...args]);
  expect(result.stderr).toBe("");
  expect(result.code).toBe(0);
  return parseAllDocuments(result.stdout)
    .map((doc) => doc.toJS() as Manifest | null)
    .filter((m): m is Manifest => m !== null);
}

async function refuse(args: string[], message: string, release = "t"): Promise<void> {
  const result = await helm(["template", release, CHART, ...args]);
  expect(result.code).not.toBe(0);
  expect(result.stderr).toContain(message);
}

const find = (ms: Manifest[], kind: string, suffix: string): Manifest => {
  const found = ms.find((m) => m.kind === kind && (m.metadata.name as string).endsWith(suffix));
  if (!found) throw new Error(`no ${kind} named …${suffix}`);
  return found;
};
const podOf = (d: Manifest): Manifest => d.spec.template.spec as Manifest;
const envOf = (d: Manifest): Record<string, Manifest> =>
  Object.fromEntries((podOf(d).containers[0].env as Manifest[]).map((e) => [e.name as string, e]));

// A matrix of values, each rendered and every object checked with unknown fields refused.
const matrix: [string, string[]][] = [
  ["defaults", []],
  ["full", ["-f", FULL]],
  ["inline", ["-f", `${CHART}/ci/inline-values.yaml`]],
  [
    "gateway with HTTPRoute, ServiceMonitor, TLS only to the server",
    [
      "--set",
      "gateway.enabled=true",
      "--set",
      "gateway.keys.existingSecret=keys",
      "--set",
      "gateway.httpRoute.enabled=true",
      "--set-json",
      'gateway.httpRoute.parentRefs=[{"name":"public","namespace":"gateways"}]',
      "--set-json",
      'gateway.httpRoute.hostnames=["mcp.example.com"]',
      "--set",
      "metrics.enabled=true",
      "--set",
      "metrics.serviceMonitor.enabled=true",
      "--set",
      "nats.tls.existingSecret=nats-ca",
      "--set",
      "nats.tls.certKey=",
      "--set",
      "nats.tls.keyKey=",
    ],
  ],
  [
    "mutual TLS per role, setup with a client certificate, network policy",
    [
      "--set",
      "nats.tls.existingSecret=nats-ca",
      "--set",
      "nats.auth.type=tls",
      "--set",
      "nats.auth.existingSecret=mesh-cert",
      "--set",
      "setup.enabled=true",
      "--set",
      "setup.credentials.type=tls",
      "--set",
      "setup.credentials.existingSecret=admin-cert",
      "--set",
      "setup.tenants={a,b}",
      "--set",
      "networkPolicy.enabled=true",
    ],
  ],
];

describe("a matrix of values", () => {
  it("renders, for every entry, objects of the current API with no unknown field", async () => {
    const all: Manifest[] = [];
    for (const [, args] of matrix) all.push(...(await render(args)));
    const kinds = new Set(all.map((m) => m.kind as string));
    for (const kind of ["HTTPRoute", "ServiceMonitor", "PodMonitor", "ScaledObject"])
      expect(kinds).toContain(kind);
    const typed = all.filter((m) => hasStrictType(m.apiVersion, m.kind));
    expect(typed.length).toBeGreaterThan(40);
    expect(strictProblems(typed)).toEqual([]);
  }, 120_000);

  it("lints with --strict for every entry", async () => {
    for (const [name, args] of matrix) {
      const result = await helm(["lint", "--strict", CHART, ...args]);
      expect(result.code, `${name}: ${result.stdout}${result.stderr}`).toBe(0);
    }
  }, 60_000);

  it("the unknown-field check itself refuses a misspelt field", () => {
    expect(
      strictProblems([
        {
          apiVersion: "v1",
          kind: "Service",
          metadata: { name: "x" },
          spec: { ports: [{ port: 80, targetPrt: "http" }] },
        },
      ]),
    ).toEqual([expect.stringContaining("'\"targetPrt\"' does not exist")]);
  });
});

describe("NATS TLS and credentials", () => {
  it("mounts nats.tls.existingSecret and wires NATS_CA, NATS_CERT and NATS_KEY in every pod", async () => {
    const ms = await render(["-f", FULL]);
    const pods = [
      ...ms.filter((m) => m.kind === "Deployment").map(podOf),
      podOf(find(ms, "Job", "setup")),
      find(ms, "Pod", "test").spec as Manifest,
    ];
    for (const pod of pods) {
      const tls = (pod.volumes as Manifest[]).find((v) => v.name === "nats-tls");
      expect(tls?.secret.secretName).toBe("toolmesh-nats-tls");
      // A role with a client certificate of its own (natsAuth type tls) takes only the CA.
      const ownCert = (pod.volumes as Manifest[]).some(
        (v) =>
          v.name === "nats-auth" && (v.secret.items as Manifest[]).some((i) => i.key === "tls.crt"),
      );
      expect(tls?.secret.items).toEqual(
        (ownCert ? ["ca.crt"] : ["ca.crt", "tls.crt", "tls.key"]).map((k) => ({ key: k, path: k })),
      );
      for (const c of [
        ...(pod.containers as Manifest[]),
        ...((pod.initContainers ?? []) as Manifest[]),
      ]) {
        expect(c.volumeMounts).toContainEqual({
          name: "nats-tls",
          mountPath: "/etc/toolmesh/nats-tls",
          readOnly: true,
        });
        const env = Object.fromEntries((c.env as Manifest[]).map((e) => [e.name, e.value]));
        expect(env.NATS_CA).toBe("/etc/toolmesh/nats-tls/ca.crt");
        expect(env.NATS_CERT).toBe(`/etc/toolmesh/${ownCert ? "nats" : "nats-tls"}/tls.crt`);
        expect(env.NATS_KEY).toBe(`/etc/toolmesh/${ownCert ? "nats" : "nats-tls"}/tls.key`);
      }
    }
  });

  it("gives a role with natsAuth type tls its own client certificate instead of nats.tls's", async () => {
    const ms = await render(["-f", FULL]);
    const builtin = find(ms, "Deployment", "executor-builtin");
    const env = envOf(builtin);
    expect(env.NATS_CERT?.value).toBe("/etc/toolmesh/nats/tls.crt");
    expect(env.NATS_KEY?.value).toBe("/etc/toolmesh/nats/tls.key");
    expect(podOf(builtin).volumes).toContainEqual({
      name: "nats-auth",
      secret: {
        secretName: "toolmesh-nats-owner-builtin",
        items: ["tls.crt", "tls.key"].map((k) => ({ key: k, path: k })),
      },
    });
    const tls = (podOf(builtin).volumes as Manifest[]).find((v) => v.name === "nats-tls");
    expect(tls?.secret.items).toEqual([{ key: "ca.crt", path: "ca.crt" }]);
  });

  it("gives each role and each tool owner its own credentials, and the owner from a Secret", async () => {
    const ms = await render(["-f", FULL]);
    const weather = envOf(find(ms, "Deployment", "executor-weather"));
    expect(weather.NATS_USER?.valueFrom).toEqual({
      secretKeyRef: { name: "toolmesh-nats-owner-weather", key: "user" },
    });
    expect(weather.TOOLMESH_OWNER?.valueFrom).toEqual({
      secretKeyRef: { name: "weather-owner", key: "owner" },
    });
    // Without ownerAccount an executor keeps its registry owner name and the mesh account.
    const materials = envOf(find(ms, "Deployment", "executor-materials"));
    expect(materials.TOOLMESH_EXECUTOR_OWNER?.value).toBe("materials-team");
    expect(materials.TOOLMESH_OWNER).toBeUndefined();
    expect(envOf(find(ms, "Deployment", "mcp-bridge-github")).TOOLMESH_OWNER).toBeUndefined();
    const gateway = find(ms, "Deployment", "gateway");
    expect(podOf(gateway).volumes).toContainEqual(
      expect.objectContaining({
        name: "nats-auth",
        secret: expect.objectContaining({ secretName: "toolmesh-nats-gateway" }),
      }),
    );
  });

  it("refuses credentials without their Secret, for a role too", async () => {
    await refuse(
      ["--set", "resolver.natsAuth.type=tls"],
      "resolver.natsAuth.existingSecret must name the Secret",
    );
  });
});

describe("autoscaling", () => {
  it("refuses an HPA whose deployment has no CPU request (it could never act)", async () => {
    await refuse(
      ["--set-json", 'executors=[{"name":"x","autoscaling":{"mode":"hpa"}}]'],
      'executors "x": autoscaling.mode is hpa, which scales on CPU use relative to the CPU request, but resources.requests.cpu is not set',
    );
    const ms = await render([
      "--set-json",
      'executors=[{"name":"x","resources":{"requests":{"cpu":"100m"}},"autoscaling":{"mode":"hpa"}}]',
    ]);
    expect(find(ms, "HorizontalPodAutoscaler", "executor-x").spec.metrics[0].resource.name).toBe(
      "cpu",
    );
  });

  it("points KEDA at the headless monitoring service, qualified by namespace, and the TOOLMESH account by default", async () => {
    const ms = await render([
      "--namespace",
      "tools",
      "--set-json",
      'executors=[{"name":"x","autoscaling":{"mode":"keda","keda":{"tools":["echo"]}}}]',
    ]);
    // KEDA's operator resolves names in its own namespace: a short name would not reach NATS.
    expect(find(ms, "ScaledObject", "executor-x").spec.triggers[0].metadata).toMatchObject({
      natsServerMonitoringEndpoint: "nats-headless.tools.svc:8222",
      account: "TOOLMESH",
      stream: "TOOLMESH_WORK",
      consumer: "work_echo",
    });
    const own = await render([
      "--set-json",
      'executors=[{"name":"x","autoscaling":{"mode":"keda","keda":{"tools":["echo"],"stream":"TOOLMESH_WORK_X"}}}]',
    ]);
    expect(find(own, "ScaledObject", "executor-x").spec.triggers[0].metadata.stream).toBe(
      "TOOLMESH_WORK_X",
    );
  });

  it("points KEDA at the tool owner's own work stream for an executor in its owner's account", async () => {
    const ms = await render([
      "--set-json",
      'executors=[{"name":"x","owner":"billing","ownerAccount":true,"autoscaling":{"mode":"keda","keda":{"tools":["billing.charge"]}}}]',
    ]);
    expect(find(ms, "ScaledObject", "executor-x").spec.triggers[0].metadata).toMatchObject({
      account: "TOOLMESH",
      stream: "TOOLMESH_WORK_billing",
      consumer: "work_billing=2echarge",
    });
    const bridge = await render([
      "--set",
      "prefix=acme.prod",
      "--set-json",
      'mcpBridges=[{"name":"gh","enabled":true,"servers":{"existingConfigMap":"gh"},"ownerAccount":true,"autoscaling":{"mode":"keda","keda":{"tools":["gh.search"]}}}]',
    ]);
    expect(find(bridge, "ScaledObject", "mcp-bridge-gh").spec.triggers[0].metadata.stream).toBe(
      "ACME_PROD_WORK_gh",
    );
    await refuse(
      [
        "--set-json",
        'executors=[{"name":"x","ownerAccount":true,"ownerSecret":{"name":"s"},"autoscaling":{"mode":"keda","keda":{"tools":["x.run"]}}}]',
      ],
      "the chart cannot read the owner, so name its work stream (TOOLMESH_WORK_<owner>) in autoscaling.keda.stream",
    );
  });

  it("makes helm test show every tool KEDA scales on, so a misspelt name fails the test", async () => {
    const ms = await render(["-f", FULL]);
    const pod = find(ms, "Pod", "test");
    expect(pod.metadata.annotations["helm.sh/hook"]).toBe("test");
    const commands = [
      ...(pod.spec.initContainers as Manifest[]),
      ...(pod.spec.containers as Manifest[]),
    ].map((c) => c.args as string[]);
    expect(commands).toEqual([
      ["tools", "list"],
      ["tools", "show", "optimize_structure"],
      ["tools", "show", "relax.structure"],
      ["tools", "show", "github.create_issue"],
      ["tools", "show", "github.search_code"],
    ]);
    // The test runs with the setup job's admin credentials, restricted like every pod.
    expect(pod.spec.volumes).toContainEqual(
      expect.objectContaining({
        name: "nats-auth",
        secret: expect.objectContaining({ secretName: "toolmesh-nats-admin" }),
      }),
    );
    expect(pod.spec.securityContext).toMatchObject({
      runAsNonRoot: true,
      seccompProfile: { type: "RuntimeDefault" },
    });
  });

  it("accepts --set executors[0].replicas=5: the first executor keeps its name", async () => {
    const ms = await render(["--set", "executors[0].replicas=5"]);
    expect(find(ms, "Deployment", "executor-builtin").spec.replicas).toBe(5);
    await refuse(
      ["--set-json", 'executors=[{"name":"a"},{"replicas":2}]'],
      "executors[1]: every executor deployment but the first",
    );
  });
});

describe("monitoring, placement, identity, image", () => {
  it("makes a PodMonitor or a ServiceMonitor with a headless metrics Service", async () => {
    const pm = await render(["-f", FULL]);
    expect(find(pm, "PodMonitor", "toolmesh").spec).toEqual({
      selector: {
        matchLabels: { "app.kubernetes.io/name": "toolmesh", "app.kubernetes.io/instance": "t" },
      },
      podMetricsEndpoints: [{ port: "metrics", path: "/metrics", interval: "30s" }],
    });
    expect(find(pm, "PodMonitor", "toolmesh").metadata.labels.release).toBe(
      "kube-prometheus-stack",
    );
    const sm = await render([
      "--set",
      "metrics.enabled=true",
      "--set",
      "metrics.serviceMonitor.enabled=true",
    ]);
    const svc = find(sm, "Service", "metrics");
    expect(svc.spec.clusterIP).toBe("None");
    expect(find(sm, "ServiceMonitor", "toolmesh").spec.selector.matchLabels).toEqual({
      "app.kubernetes.io/instance": "t",
      "toolmesh.io/metrics": "true",
    });
    await refuse(["--set", "metrics.podMonitor.enabled=true"], "metrics.enabled is false");
  });

  it("places, identifies and images each role on its own", async () => {
    const ms = await render(["-f", FULL]);
    const weather = podOf(find(ms, "Deployment", "executor-weather"));
    expect(weather.nodeSelector).toEqual({ workload: "tools" });
    expect(weather.tolerations[0]).toMatchObject({ key: "dedicated", value: "tools" });
    expect(weather.serviceAccountName).toBe("t-toolmesh-executor-weather");
    expect(find(ms, "ServiceAccount", "executor-weather").metadata.annotations).toEqual({
      "eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/weather-tools",
    });
    const resolver = podOf(find(ms, "Deployment", "resolver"));
    expect(resolver.nodeSelector).toBeUndefined();
    expect(resolver.serviceAccountName).toBeUndefined();
    expect(resolver.containers[0].image).toBe("registry.example.com/platform/toolmesh:0.1.0");
    expect(podOf(find(ms, "Deployment", "executor-materials")).containers[0].image).toBe(
      "registry.example.com/materials/toolmesh-tools:2.3",
    );
    // The own-image example runs only the team's executor on the team's image.
    const own = await render(["-f", "examples/deploy/helm/own-image-values.yaml"]);
    const images = Object.fromEntries(
      own
        .filter((m) => m.kind === "Deployment")
        .map((d) => [d.metadata.name, podOf(d).containers[0].image]),
    );
    expect(images).toEqual({
      "t-toolmesh-resolver": "registry.example.com/platform/toolmesh:0.1.0",
      "t-toolmesh-schema-expander": "registry.example.com/platform/toolmesh:0.1.0",
      "t-toolmesh-executor-builtin": "registry.example.com/platform/toolmesh:0.1.0",
      "t-toolmesh-executor-text": "registry.example.com/acme/toolmesh-tools:1.0",
    });
  });
});

describe("setup, rollouts and names", () => {
  it("gives setup.streamReplicas to the setup Job and every pod, and refuses it twice", async () => {
    const ms = await render(["-f", FULL]);
    const job = find(ms, "Job", "setup");
    const jobEnv = Object.fromEntries(
      (job.spec.template.spec.containers[0].env as Manifest[]).map((e) => [e.name, e.value]),
    );
    expect(jobEnv.TOOLMESH_STREAM_REPLICAS).toBe("3");
    for (const d of ms.filter((m) => m.kind === "Deployment"))
      expect(envOf(d).TOOLMESH_STREAM_REPLICAS?.value).toBe("3");
    expect(job.metadata.annotations["helm.sh/hook"]).toBe("pre-install,pre-upgrade,pre-rollback");
    await refuse(["--set", "env.TOOLMESH_STREAM_REPLICAS=3"], "set setup.streamReplicas instead");
  });

  it("passes setup.tenants to the setup Job as --tenants a,b, and refuses an id with a comma", async () => {
    const setup = [
      "--set",
      "setup.enabled=true",
      "--set",
      "setup.credentials.existingSecret=admin",
    ];
    const args = async (extra: string[]) =>
      podOf(find(await render([...setup, ...extra]), "Job", "setup")).containers[0]
        .args as string[];
    expect(await args([])).toEqual(["setup"]);
    expect(await args(["--set", "setup.tenants={a,b}"])).toEqual(["setup", "--tenants", "a,b"]);
    expect(await args(["--set-json", 'setup.tenants=["acme"]'])).toEqual([
      "setup",
      "--tenants",
      "acme",
    ]);
    await refuse([...setup, "--set-json", 'setup.tenants=["a,b"]'], "/setup/tenants/0");
  });

  it("changes no pod's checksum when only replicas change, and changes it when a file does", async () => {
    const checksums = async (args: string[]) =>
      Object.fromEntries(
        (await render(["-f", `${CHART}/ci/inline-values.yaml`, ...args]))
          .filter((m) => m.kind === "Deployment")
          .map((d) => [d.metadata.name, d.spec.template.metadata.annotations["checksum/config"]]),
      );
    const before = await checksums([]);
    expect(
      await checksums([
        "--set",
        "resolver.replicas=7",
        "--set",
        "executors[0].name=builtin",
        "--set",
        "executors[0].replicas=4",
      ]),
    ).toEqual(before);
    const changed = await checksums([
      "--set",
      "mcpBridges[0].name=everything",
      "--set",
      "mcpBridges[0].enabled=true",
      "--set",
      "mcpBridges[0].servers.files.x\\.yaml=changed",
    ]);
    expect(changed["t-toolmesh-mcp-bridge-everything"]).not.toBe(
      before["t-toolmesh-mcp-bridge-everything"],
    );
    expect(changed["t-toolmesh-resolver"]).toBe(before["t-toolmesh-resolver"]);
  });

  it("refuses a release name that would make a Deployment name too long, in template and lint", async () => {
    const long = "a-release-name-that-is-long-enough-to-collide";
    await refuse(
      ["--set-json", 'executors=[{"name":"weather-forecast-eu"},{"name":"weather-forecast-us"}]'],
      "above the 63 Kubernetes allows",
      long,
    );
    const lint = await helm([
      "lint",
      "--strict",
      CHART,
      "--set",
      `fullnameOverride=${"x".repeat(60)}`,
    ]);
    expect(lint.code).not.toBe(0);
    expect(lint.stdout + lint.stderr).toContain("above the 63 Kubernetes allows");
  });

  it("makes PDBs that let unready pods be evicted, maxUnavailable for bridges", async () => {
    const ms = await render([
      "-f",
      `${CHART}/ci/inline-values.yaml`,
      "--set",
      "mcpBridges[0].name=everything",
      "--set",
      "mcpBridges[0].enabled=true",
      "--set",
      "mcpBridges[0].servers.existingConfigMap=mcp",
      "--set",
      "mcpBridges[0].pdb.enabled=true",
    ]);
    const pdb = find(ms, "PodDisruptionBudget", "mcp-bridge-everything");
    expect(pdb.spec.unhealthyPodEvictionPolicy).toBe("AlwaysAllow");
    expect(pdb.spec.maxUnavailable).toBe(1);
    expect(pdb.spec).not.toHaveProperty("minAvailable");
    const values = readFileSync(`${CHART}/values.yaml`, "utf8");
    expect(values).toMatch(/mcpBridges:[\s\S]*pdb:\n\s+enabled: false\n\s+maxUnavailable: 1/);
  });
});

describe("the gateway", () => {
  it("is a Deployment with a Service, an Ingress and an HPA, probed on its HTTP port", async () => {
    const ms = await render(["-f", FULL]);
    const d = find(ms, "Deployment", "gateway");
    expect(d.spec).not.toHaveProperty("replicas"); // the HPA owns them
    const c = podOf(d).containers[0];
    expect(c.args).toEqual(["serve", "gateway"]);
    expect(c.ports).toContainEqual({ name: "http", containerPort: 8787, protocol: "TCP" });
    expect(c.readinessProbe.httpGet).toEqual({ path: "/readyz", port: "http" });
    expect(c.livenessProbe.httpGet).toEqual({ path: "/healthz", port: "http" });
    expect(c.startupProbe.httpGet).toEqual({ path: "/healthz", port: "http" });
    const env = envOf(d);
    expect(env.TOOLMESH_GATEWAY_HOST?.value).toBe("0.0.0.0");
    expect(env.TOOLMESH_GATEWAY_PORT?.value).toBe("8787");
    expect(env.TOOLMESH_GATEWAY_KEYS_FILE?.value).toBe("/etc/toolmesh/gateway/keys.yaml");
    expect(podOf(d).volumes).toContainEqual({
      name: "gateway-keys",
      secret: { secretName: "toolmesh-gateway-keys" },
    });
    expect(find(ms, "Service", "gateway").spec.ports).toEqual([
      { name: "http", port: 80, targetPort: "http", protocol: "TCP" },
    ]);
    expect(find(ms, "Ingress", "gateway").spec.rules[0]).toMatchObject({
      host: "mcp.example.com",
      http: {
        paths: [
          {
            path: "/",
            pathType: "Prefix",
            backend: { service: { name: "t-toolmesh-gateway", port: { name: "http" } } },
          },
        ],
      },
    });
    expect(find(ms, "HorizontalPodAutoscaler", "gateway").spec).toMatchObject({
      minReplicas: 2,
      maxReplicas: 6,
    });
  });

  it("attaches an HTTPRoute to a Gateway, and refuses what cannot work", async () => {
    const base = ["--set", "gateway.enabled=true", "--set", "gateway.keys.existingSecret=k"];
    const ms = await render([
      ...base,
      "--set",
      "gateway.httpRoute.enabled=true",
      "--set-json",
      'gateway.httpRoute.parentRefs=[{"name":"public"}]',
    ]);
    expect(find(ms, "HTTPRoute", "gateway").spec).toMatchObject({
      parentRefs: [{ name: "public" }],
      rules: [{ backendRefs: [{ name: "t-toolmesh-gateway", port: 80 }] }],
    });
    await refuse(["--set", "gateway.enabled=true"], "gateway.keys.existingSecret");
    await refuse(
      [...base, "--set", "gateway.httpRoute.enabled=true"],
      "parentRefs must name the Gateway",
    );
    await refuse(
      [
        ...base,
        "--set",
        "gateway.httpRoute.enabled=true",
        "--set-json",
        'gateway.httpRoute.parentRefs=[{"name":"p"}]',
        "--set",
        "gateway.ingress.enabled=true",
      ],
      "choose one",
    );
  });
});

describe("network policies and notes", () => {
  it("lets pods reach DNS and NATS only, and executors and bridges their tools' APIs", async () => {
    const ms = await render(["-f", FULL]);
    const resolver = find(ms, "NetworkPolicy", "resolver").spec;
    expect(resolver.policyTypes).toEqual(["Ingress", "Egress"]);
    // DNS, NATS, and the OTLP endpoint's port (otel.endpoint is http://…:4318).
    expect(resolver.egress).toHaveLength(3);
    expect(resolver.egress[1]).toEqual({
      to: [{ namespaceSelector: { matchLabels: { "kubernetes.io/metadata.name": "nats" } } }],
      ports: [{ port: 4222, protocol: "TCP" }],
    });
    expect(resolver.egress[2]).toEqual({ ports: [{ port: 4318, protocol: "TCP" }] });
    expect(find(ms, "NetworkPolicy", "executor-weather").spec.egress).toContainEqual({});
    expect(find(ms, "NetworkPolicy", "gateway").spec.ingress[0].ports).toContainEqual({
      port: "http",
      protocol: "TCP",
    });
  });

  it("NOTES name the prefix and run pods that pass the restricted profile", async () => {
    const result = await helm(["install", "t", CHART, "--dry-run=client", "-f", FULL]);
    expect(result.code).toBe(0);
    const notes = result.stdout.slice(result.stdout.indexOf("NOTES:"));
    expect(notes).toContain("prefix acme.prod");
    expect(notes).toContain('{"name":"TOOLMESH_PREFIX","value":"acme.prod"}');
    const overrides = /--overrides='([^']+)'/.exec(notes)?.[1];
    const pod = JSON.parse(overrides ?? "null") as Manifest;
    expect(pod.spec.securityContext).toMatchObject({
      runAsNonRoot: true,
      seccompProfile: { type: "RuntimeDefault" },
    });
    expect(pod.spec.containers[0].securityContext).toMatchObject({
      allowPrivilegeEscalation: false,
      capabilities: { drop: ["ALL"] },
    });
    expect(notes).toContain("helm test t");
  });
});

it("values.schema.json accepts the new values in ajv as in helm", () => {
  const ajv = new Ajv({ strict: false });
  const validate = ajv.compile(
    JSON.parse(readFileSync(`${CHART}/values.schema.json`, "utf8")) as object,
  );
  expect(validate({ executors: [{ replicas: 5 }] }), ajv.errorsText(validate.errors)).toBe(true);
  expect(validate({ nats: { tls: { existingSecret: "x", caFile: "y" } } })).toBe(false);
});

describe("the README's Helm path", () => {
  const readme = readFileSync("README.md", "utf8");
  const section = readme.slice(
    readme.indexOf("### Kubernetes with Helm"),
    readme.indexOf("## Clusters and leaf nodes"),
  );
  const command = (start: string): string[] => {
    const at = section.indexOf(start);
    expect(at).toBeGreaterThan(-1);
    const full = section
      .slice(at)
      .split(/\n(?!\s)/)[0]!
      .replace(/\\\n\s*/g, " ");
    return [...full.matchAll(/--set ([^\s]+)/g)].map((m) =>
      m[1]!.replace(/^([^=]+)='(.*)'$/, "$1=$2"),
    );
  };

  it("installs the image it built and pushed, and renders valid objects with it", async () => {
    const built = /docker build -f deploy\/Dockerfile -t (\S+) \./.exec(section)?.[1];
    expect(section).toContain(`docker push ${built}`);
    const sets = command("helm install toolmesh helm/toolmesh");
    const ms = await render(sets.flatMap((s) => ["--set", s]));
    for (const d of ms.filter((m) => m.kind === "Deployment" || m.kind === "Job"))
      expect(podOf(d).containers[0].image).toBe(built);
    expect(strictProblems(ms.filter((m) => hasStrictType(m.apiVersion, m.kind)))).toEqual([]);
    expect(envOf(find(ms, "Deployment", "resolver")).TOOLMESH_STREAM_REPLICAS?.value).toBe("3");
  }, 60_000);

  it("runs the NATS version docker-compose.yml runs", () => {
    const tag = command("helm install nats nats/nats")
      .find((s) => s.startsWith("container.image.tag="))
      ?.split("=")[1];
    const compose = readFileSync("docker-compose.yml", "utf8");
    expect(compose).toContain(`\${NATS_IMAGE:-nats:${tag}}`);
  });
});
