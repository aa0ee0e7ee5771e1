// The Helm chart (helm/toolmesh), checked with a real helm binary: `helm lint --strict` and
// `helm template` for every ci/*-values.yaml; every rendered object validated against the
// Kubernetes schemas (kubernetes-models) or, for ScaledObject, against KEDA's CRD schema; the
// values files validated against values.schema.json with ajv; and the renders that must fail.
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { subjectToken } from "@toolmesh/protocol";
import { Ajv } from "ajv";
import { ConfigMap, Pod, Secret, Service, ServiceAccount } from "kubernetes-models/v1";
import { Deployment } from "kubernetes-models/apps/v1";
import { HorizontalPodAutoscaler } from "kubernetes-models/autoscaling/v2";
import { Job } from "kubernetes-models/batch/v1";
import { Ingress, NetworkPolicy } from "kubernetes-models/networking.k8s.io/v1";
import { PodDisruptionBudget } from "kubernetes-models/policy/v1";
import { describe, expect, it } from "vitest";
import { parseAllDocuments, parse as parseYaml } from "yaml";
import { helm } from "./helpers/helm.js";
import { hasStrictType, strictProblems } from "./helpers/k8s-strict.js";

const CHART = "helm/toolmesh";
const ciValues = readdirSync(join(CHART, "ci"))
  .filter((f) => f.endsWith("-values.yaml"))
  .map((f) => join(CHART, "ci", f));
const exampleValues = readdirSync("examples/deploy/helm")
  .filter((f) => f.endsWith(".yaml"))
  .map((f) => join("examples/deploy/helm", f));

type Manifest = Record<string, any>;

const models: Record<string, new (data: never) => { validate(): void }> = {
  "apps/v1/Deployment": Deployment,
  "policy/v1/PodDisruptionBudget": PodDisruptionBudget,
  "autoscaling/v2/HorizontalPodAutoscaler": HorizontalPodAutoscaler,
  "v1/ConfigMap": ConfigMap,
  "v1/Secret": Secret,
  "batch/v1/Job": Job,
  "v1/Service": Service,
  "v1/ServiceAccount": ServiceAccount,
  "v1/Pod": Pod,
  "networking.k8s.io/v1/Ingress": Ingress,
  "networking.k8s.io/v1/NetworkPolicy": NetworkPolicy,
};

// int32 is the only format the KEDA schema uses; the range is checked by `type: integer`.
const ajv = new Ajv({ allErrors: true, strict: false, formats: { int32: true } });
const validateScaledObject = ajv.compile(
  JSON.parse(readFileSync("test/fixtures/keda/scaledobject.schema.json", "utf8")) as object,
);
const crdSchema = (name: string) =>
  ajv.compile(JSON.parse(readFileSync(`test/fixtures/crds/${name}.schema.json`, "utf8")) as object);
const crds: Record<string, ReturnType<typeof ajv.compile>> = {
  PodMonitor: crdSchema("podmonitor"),
  ServiceMonitor: crdSchema("servicemonitor"),
  HTTPRoute: crdSchema("httproute"),
};
const validateValues = ajv.compile(
  JSON.parse(readFileSync(join(CHART, "values.schema.json"), "utf8")) as object,
);

async function render(args: string[]): Promise<Manifest[]> {
  const result = await helm(["template", "t", CHART, ...args]);
  expect(result.stderr).toBe("");
  expect(result.code).toBe(0);
  return parseAllDocuments(result.stdout)
    .map((doc) => doc.toJS() as Manifest | null)
    .filter((m): m is Manifest => m !== null);
}

/**
 * Throws with the object's kind and name when it does not match its schema (unknown fields are
 * checked for the whole render at once by {@link strictProblems}).
 */
function validateManifest(m: Manifest): void {
  const where = `${m.kind as string} ${m.metadata?.name as string}`;
  const crd = crds[m.kind as string];
  if (crd !== undefined) {
    if (!crd(m)) throw new Error(`${where}: ${ajv.errorsText(crd.errors)}`);
    return;
  }
  if (m.kind === "ScaledObject") {
    if (!validateScaledObject(m))
      throw new Error(`${where}: ${ajv.errorsText(validateScaledObject.errors)}`);
    return;
  }
  const Model = models[`${m.apiVersion as string}/${m.kind as string}`];
  if (!Model)
    throw new Error(`${where}: no schema for ${m.apiVersion as string} ${m.kind as string}`);
  try {
    new Model(m as never).validate();
  } catch (err) {
    throw new Error(`${where}: ${(err as Error).message}`, { cause: err });
  }
}

const deployments = (ms: Manifest[]) => ms.filter((m) => m.kind === "Deployment");
const byName = (ms: Manifest[], kind: string, suffix: string): Manifest => {
  const found = ms.find((m) => m.kind === kind && (m.metadata.name as string).endsWith(suffix));
  if (!found) throw new Error(`no ${kind} named …${suffix}`);
  return found;
};
const envOf = (d: Manifest): Record<string, string> =>
  Object.fromEntries(
    (d.spec.template.spec.containers[0].env as { name: string; value?: string }[]).map((e) => [
      e.name,
      e.value ?? "(from secret)",
    ]),
  );

describe.each(ciValues)("%s", (file) => {
  it("passes helm lint --strict", async () => {
    const result = await helm(["lint", "--strict", CHART, "-f", file]);
    expect(result.stdout + result.stderr).toContain("0 chart(s) failed");
    expect(result.code).toBe(0);
  });

  it("renders objects that match their Kubernetes (or KEDA) schema, with no unknown field", async () => {
    const manifests = await render(["-f", file]);
    expect(deployments(manifests).length).toBeGreaterThanOrEqual(3);
    for (const m of manifests) validateManifest(m);
    expect(strictProblems(manifests.filter((m) => hasStrictType(m.apiVersion, m.kind)))).toEqual(
      [],
    );
  }, 60_000);

  it("renders every pod restricted, with probes on the named health port", async () => {
    const manifests = await render(["-f", file]);
    const pods = [
      ...deployments(manifests).map((d) => d.spec.template.spec as Manifest),
      ...manifests.filter((m) => m.kind === "Job").map((j) => j.spec.template.spec as Manifest),
    ];
    for (const pod of pods) {
      expect(pod.securityContext).toMatchObject({
        runAsNonRoot: true,
        seccompProfile: { type: "RuntimeDefault" },
      });
      expect(pod.automountServiceAccountToken).toBe(false);
      const container = pod.containers[0] as Manifest;
      expect(container.securityContext).toEqual({
        allowPrivilegeEscalation: false,
        readOnlyRootFilesystem: true,
        runAsNonRoot: true,
        capabilities: { drop: ["ALL"] },
      });
      const tmp = (container.volumeMounts as Manifest[]).find((v) => v.mountPath === "/tmp");
      expect(pod.volumes.find((v: Manifest) => v.name === tmp?.name)).toHaveProperty("emptyDir");
    }
    for (const d of deployments(manifests)) {
      const container = d.spec.template.spec.containers[0] as Manifest;
      expect(container.ports[0]).toMatchObject({ name: "health", containerPort: 8080 });
      // The gateway serves /healthz and /readyz on its HTTP port; every other role on `health`.
      const ready = d.metadata.name.endsWith("-gateway") ? "http" : "health";
      expect(container.livenessProbe.httpGet).toEqual({ path: "/healthz", port: ready });
      expect(container.readinessProbe.httpGet).toEqual({ path: "/readyz", port: ready });
      expect(d.spec.selector.matchLabels).toEqual(
        Object.fromEntries(
          Object.entries(d.spec.template.metadata.labels as Record<string, string>).filter(([k]) =>
            Object.keys(d.spec.selector.matchLabels as object).includes(k),
          ),
        ),
      );
      expect(d.metadata.labels["app.kubernetes.io/name"]).toBe("toolmesh");
    }
  });

  it("is accepted by values.schema.json (ajv)", () => {
    const values = (parseYaml(readFileSync(file, "utf8")) as unknown) ?? {};
    expect(validateValues(values), ajv.errorsText(validateValues.errors)).toBe(true);
  });
});

describe("example values", () => {
  it.each([join(CHART, "values.yaml"), ...exampleValues])(
    "%s is accepted by values.schema.json and renders valid objects",
    async (file) => {
      const values = parseYaml(readFileSync(file, "utf8")) as unknown;
      expect(validateValues(values), ajv.errorsText(validateValues.errors)).toBe(true);
      for (const m of await render(["-f", file])) validateManifest(m);
    },
  );

  it("values.schema.json refuses unknown keys, in ajv and in helm", async () => {
    expect(validateValues({ resolver: { replica: 2 } })).toBe(false);
    expect(ajv.errorsText(validateValues.errors)).toContain("must NOT have additional properties");
    const result = await helm(["template", "t", CHART, "--set", "resolver.replica=2"]);
    expect(result.code).not.toBe(0);
    expect(result.stderr).toContain("additional properties 'replica' not allowed");
  });
});

describe("what the full values render", () => {
  const file = join(CHART, "ci", "full-values.yaml");

  it("makes one Deployment per executor, each with its own owner, tools and scaling", async () => {
    const manifests = await render(["-f", file]);
    const names = deployments(manifests).map((d) => d.metadata.name as string);
    expect(names).toEqual([
      "t-toolmesh-resolver",
      "t-toolmesh-schema-expander",
      "t-toolmesh-gateway",
      "t-toolmesh-executor-builtin",
      "t-toolmesh-executor-weather",
      "t-toolmesh-executor-materials",
      "t-toolmesh-mcp-bridge-github",
    ]);
    const weather = byName(manifests, "Deployment", "executor-weather");
    expect(envOf(weather)).toMatchObject({
      TOOLMESH_OWNER: "(from secret)",
      TOOLMESH_EXECUTOR_OWNER: "(from secret)",
      TOOLMESH_CONCURRENCY: "32",
      TOOLMESH_NATIVE_TOOLS_DIR: "/etc/toolmesh/native",
      TOOLMESH_PRESETS_FILE: "/etc/toolmesh/presets/presets.yaml",
      TOOLMESH_SHUTDOWN_GRACE_MS: "60000",
      TOOLMESH_PREFIX: "acme.prod",
      TOOLMESH_ACK_WAIT_MS: "15000",
      NATS_USER: "(from secret)",
      NATS_CA: "/etc/toolmesh/nats-tls/ca.crt",
    });
    expect(weather.spec.template.spec.containers[0].envFrom).toEqual([
      { secretRef: { name: "weather-api" } },
    ]);
    // A role with credentials of its own mounts its own Secret; the others use nats.auth.
    const secretOf = (d: Manifest) =>
      (d.spec.template.spec.volumes as { name: string; secret?: { secretName: string } }[]).find(
        (v) => v.name === "nats-auth",
      )?.secret?.secretName;
    expect(secretOf(byName(manifests, "Deployment", "resolver"))).toBe("toolmesh-nats-resolver");
    expect(secretOf(byName(manifests, "Deployment", "schema-expander"))).toBe(
      "toolmesh-nats-service",
    );
    expect(secretOf(weather)).toBeUndefined(); // user and password come from env
    // Autoscaled deployments leave replicas to their autoscaler.
    expect(weather.spec).not.toHaveProperty("replicas");
    expect(byName(manifests, "Deployment", "executor-builtin").spec.replicas).toBe(2);
    expect(envOf(byName(manifests, "Deployment", "executor-materials")).TOOLMESH_TOOLS_DIR).toBe(
      "/etc/toolmesh/tools",
    );
    // Every gateway replica signs requestState with the one key of the named Secret.
    const gatewayEnv = byName(manifests, "Deployment", "gateway").spec.template.spec.containers[0]
      .env as { name: string; valueFrom?: unknown }[];
    expect(gatewayEnv.find((e) => e.name === "TOOLMESH_GATEWAY_REQUEST_STATE_KEY")).toEqual({
      name: "TOOLMESH_GATEWAY_REQUEST_STATE_KEY",
      valueFrom: {
        secretKeyRef: { name: "toolmesh-gateway-request-state", key: "request-state-key" },
      },
    });
    expect(byName(manifests, "HorizontalPodAutoscaler", "executor-weather").spec).toMatchObject({
      minReplicas: 2,
      maxReplicas: 8,
      scaleTargetRef: { kind: "Deployment", name: "t-toolmesh-executor-weather" },
    });
  });

  it("derives terminationGracePeriodSeconds from the shutdown grace and force times", async () => {
    const manifests = await render(["-f", file]);
    const grace = (suffix: string) =>
      byName(manifests, "Deployment", suffix).spec.template.spec.terminationGracePeriodSeconds;
    expect(grace("resolver")).toBe(25 + 5 + 5);
    expect(grace("executor-weather")).toBe(60 + 5 + 5);
    expect(envOf(byName(manifests, "Deployment", "resolver")).TOOLMESH_SHUTDOWN_FORCE_MS).toBe(
      "5000",
    );
    const odd = await render([
      "--set",
      "shutdownGraceMs=1500",
      "--set",
      "shutdownForceMs=700",
      "--set",
      "terminationExtraSeconds=2",
    ]);
    expect(
      byName(odd, "Deployment", "resolver").spec.template.spec.terminationGracePeriodSeconds,
    ).toBe(3 + 2);
  });

  it("scales KEDA deployments on the lag of their tools' work consumers, to zero if asked", async () => {
    const manifests = await render(["-f", file]);
    const materials = byName(manifests, "ScaledObject", "executor-materials");
    expect(materials.spec).toMatchObject({ minReplicaCount: 0, maxReplicaCount: 20 });
    // The sum of the tools' lags, not the busiest tool's alone.
    expect(materials.spec.advanced.scalingModifiers).toEqual({
      formula: "lag0 + lag1",
      target: "5",
      activationTarget: "1",
      metricType: "AverageValue",
    });
    expect(materials.spec.triggers).toEqual(
      ["optimize_structure", "relax.structure"].map((tool, i) => ({
        type: "nats-jetstream",
        name: `lag${i}`,
        metadata: {
          natsServerMonitoringEndpoint: "nats-headless.nats.svc.cluster.local:8222",
          account: "TOOLMESH",
          stream: "ACME_PROD_WORK",
          consumer: `work_${subjectToken(tool)}`,
          lagThreshold: "5",
          activationLagThreshold: "1",
          useHttps: "false",
        },
      })),
    );
  });

  it("names the work consumers exactly as the executors do, for any tool name it accepts", async () => {
    const tools = [
      "echo",
      "everything.get-sum",
      "a=b",
      "files/*",
      "my tool",
      "x".repeat(70),
      "github.search_code.with.a.very.long.name.that.goes.past.the.limit",
    ];
    const manifests = await render([
      "--set",
      "executors[0].name=builtin",
      "--set",
      "executors[0].autoscaling.mode=keda",
      "--set-json",
      `executors[0].autoscaling.keda.tools=${JSON.stringify(tools)}`,
    ]);
    const consumers = byName(manifests, "ScaledObject", "executor-builtin").spec.triggers.map(
      (t: Manifest) => t.metadata.consumer as string,
    );
    expect(consumers).toEqual(tools.map((tool) => `work_${subjectToken(tool)}`));
  });

  it("gives a metrics port and scrape annotations when metrics are on", async () => {
    const manifests = await render(["-f", file]);
    for (const d of deployments(manifests)) {
      expect(d.spec.template.spec.containers[0].ports).toContainEqual({
        name: "metrics",
        containerPort: 9464,
        protocol: "TCP",
      });
      expect(envOf(d).TOOLMESH_METRICS_PORT).toBe("9464");
      expect(d.spec.template.metadata.annotations).toMatchObject({
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "9464",
        "prometheus.io/path": "/metrics",
      });
    }
  });

  it("runs toolmesh setup as a pre-install/pre-upgrade/pre-rollback hook with the admin credentials", async () => {
    const manifests = await render(["-f", file]);
    const job = byName(manifests, "Job", "setup");
    expect(job.metadata.annotations["helm.sh/hook"]).toBe("pre-install,pre-upgrade,pre-rollback");
    const container = job.spec.template.spec.containers[0] as Manifest;
    expect(container.args).toEqual(["setup"]);
    expect(job.spec.template.spec.volumes).toContainEqual({
      name: "nats-auth",
      secret: {
        secretName: "toolmesh-nats-admin",
        items: [{ key: "nats.creds", path: "nats.creds" }],
      },
    });
  });

  it("mounts tool sets and agents for the resolver and the schema expander", async () => {
    const manifests = await render(["-f", file]);
    for (const suffix of ["resolver", "schema-expander"]) {
      const d = byName(manifests, "Deployment", suffix);
      expect(envOf(d).TOOLMESH_CONFIG_DIR).toBe("/etc/toolmesh/configs");
      expect(d.spec.template.spec.containers[0].volumeMounts).toEqual(
        expect.arrayContaining([
          expect.objectContaining({ mountPath: "/etc/toolmesh/configs/tool_sets" }),
          expect.objectContaining({ mountPath: "/etc/toolmesh/configs/agents" }),
        ]),
      );
    }
    expect(byName(manifests, "ConfigMap", "tool-sets").data).toHaveProperty(["everyday.yaml"]);
  });
});

describe("values the chart refuses to render", () => {
  const refuse = async (args: string[], message: string) => {
    const result = await helm(["template", "t", CHART, ...args]);
    expect(result.code).not.toBe(0);
    expect(result.stderr).toContain(message);
  };

  it("HPA and KEDA at once", async () => {
    await refuse(
      ["-f", "test/fixtures/helm/hpa-and-keda-values.yaml"],
      'executors "busy": autoscaling asks for HPA and KEDA at once',
    );
  });

  it("an HPA asked to scale to zero", async () => {
    await refuse(
      ["--set-json", 'executors=[{"name":"x","autoscaling":{"mode":"hpa","minReplicas":0}}]'],
      "an HPA cannot scale to zero",
    );
  });

  it("KEDA without the tools to watch", async () => {
    await refuse(
      ["--set-json", 'executors=[{"name":"x","autoscaling":{"mode":"keda"}}]'],
      "no work consumers are named",
    );
  });

  it("two executor deployments with one name", async () => {
    await refuse(
      ["--set-json", 'executors=[{"name":"x"},{"name":"x"}]'],
      'the name "x" is used twice',
    );
  });

  it("NATS credentials without their Secret", async () => {
    await refuse(
      ["--set", "nats.auth.type=creds"],
      "nats.auth.existingSecret must name the Secret",
    );
  });

  it("an MCP bridge without servers", async () => {
    await refuse(
      ["--set-json", 'mcpBridges=[{"name":"b","enabled":true}]'],
      "give its MCP server files in servers.files",
    );
  });
});
