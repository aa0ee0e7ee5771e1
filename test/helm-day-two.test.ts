// Day two with the chart, rendered with the real helm binary: the escape hatches globally and per
// role, the mesh settings in every pod and the setup Job (and refused in a role's env), KEDA on
// the sum of a deployment's tools, egress derived from the endpoints the pods call (with a
// warning for one no rule reaches), and the chart's own version, README and upgrade notes.
import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { parseAllDocuments, parse as parseYaml } from "yaml";
import { helm } from "./helpers/helm.js";

const CHART = "helm/toolmesh";
const HATCHES = `${CHART}/ci/escape-hatches-values.yaml`;
type Manifest = Record<string, any>;

async function render(args: string[]): Promise<Manifest[]> {
  const result = await helm(["template", "t", CHART, ...args]);
  expect(result.stderr).toBe("");
  expect(result.code).toBe(0);
  return parseAllDocuments(result.stdout)
    .map((doc) => doc.toJS() as Manifest | null)
    .filter((m): m is Manifest => m !== null);
}

async function refuse(args: string[], message: string): Promise<void> {
  const result = await helm(["template", "t", CHART, ...args]);
  expect(result.code).not.toBe(0);
  expect(result.stderr).toContain(message);
}

const find = (ms: Manifest[], kind: string, suffix: string): Manifest => {
  const found = ms.find((m) => m.kind === kind && (m.metadata.name as string).endsWith(suffix));
  if (!found) throw new Error(`no ${kind} named …${suffix}`);
  return found;
};
const podOf = (m: Manifest): Manifest => m.spec.template.spec as Manifest;
const containerOf = (m: Manifest): Manifest => podOf(m).containers[0] as Manifest;
const envOf = (m: Manifest): Record<string, Manifest> =>
  Object.fromEntries((containerOf(m).env as Manifest[]).map((e) => [e.name as string, e]));

describe("escape hatches", () => {
  it("adds extra env, envFrom, volumes, classes, probes and strategy, globally and per role", async () => {
    const ms = await render(["-f", HATCHES]);
    const digest = "sha256:4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945";
    const resolver = find(ms, "Deployment", "resolver");
    const builtin = find(ms, "Deployment", "executor-builtin");
    const job = find(ms, "Job", "setup");
    for (const m of [resolver, builtin, job]) {
      expect(containerOf(m).image).toBe(`registry.example.com/platform/toolmesh:0.1.0@${digest}`);
      expect(envOf(m).POD_NAME).toEqual({
        name: "POD_NAME",
        valueFrom: { fieldRef: { fieldPath: "metadata.name" } },
      });
      expect(containerOf(m).envFrom).toContainEqual({ configMapRef: { name: "platform-env" } });
      expect(podOf(m).volumes).toContainEqual({
        name: "ca-bundle",
        configMap: { name: "corporate-ca" },
      });
      expect(containerOf(m).volumeMounts).toContainEqual({
        name: "ca-bundle",
        mountPath: "/etc/ssl/corporate",
        readOnly: true,
      });
    }
    // Global values, and a role's own winning or added.
    expect(podOf(resolver).priorityClassName).toBe("toolmesh-critical");
    expect(podOf(resolver).runtimeClassName).toBeUndefined();
    expect(podOf(builtin)).toMatchObject({
      priorityClassName: "tools",
      runtimeClassName: "gvisor",
    });
    expect(envOf(builtin).WEATHER_API_KEY?.valueFrom).toEqual({
      secretKeyRef: { name: "weather-api", key: "key" },
    });
    expect(envOf(resolver).WEATHER_API_KEY).toBeUndefined();
    expect(resolver.spec.strategy).toEqual({
      type: "RollingUpdate",
      rollingUpdate: { maxSurge: 1, maxUnavailable: 0 },
    });
    expect(builtin.spec.strategy).toEqual({ type: "Recreate" });
    // Probe fields over the chart's: the handler stays.
    expect(containerOf(resolver).livenessProbe).toEqual({
      httpGet: { path: "/healthz", port: "health" },
      periodSeconds: 20,
      timeoutSeconds: 3,
      failureThreshold: 6,
    });
    expect(containerOf(builtin).readinessProbe).toMatchObject({
      httpGet: { path: "/readyz", port: "health" },
      failureThreshold: 4,
    });
    expect(containerOf(resolver).readinessProbe.failureThreshold).toBe(2);
  });

  it("gives the setup Job its own annotations, arguments and ServiceAccount", async () => {
    const job = find(await render(["-f", HATCHES]), "Job", "setup");
    expect(job.spec.template.metadata.annotations).toEqual({ "sidecar.istio.io/inject": "false" });
    expect(containerOf(job).args).toEqual(["setup", "--remove-obsolete"]);
    expect(podOf(job)).toMatchObject({
      serviceAccountName: "toolmesh-setup",
      priorityClassName: "toolmesh-critical",
    });
  });

  it("pins by digest without a tag, and a role with another repository does not inherit it", async () => {
    const digest = `sha256:${"a".repeat(64)}`;
    const ms = await render([
      "--set",
      `image.digest=${digest}`,
      "--set-json",
      'executors=[{"name":"team","image":{"repository":"registry.example.com/team/tools","tag":"3.1"}}]',
    ]);
    expect(containerOf(find(ms, "Deployment", "resolver")).image).toBe(`toolmesh@${digest}`);
    expect(containerOf(find(ms, "Deployment", "executor-team")).image).toBe(
      "registry.example.com/team/tools:3.1",
    );
    await refuse(["--set", "image.digest=latest"], "/image/digest");
  });
});

describe("the mesh settings", () => {
  it("reach every pod and the setup Job alike", async () => {
    const ms = await render(["-f", HATCHES]);
    const pods = [...ms.filter((m) => m.kind === "Deployment"), find(ms, "Job", "setup")];
    expect(pods.length).toBeGreaterThanOrEqual(4);
    for (const m of pods) {
      const env = envOf(m);
      expect(env.TOOLMESH_ACK_WAIT_MS?.value).toBe("5000");
      expect(env.TOOLMESH_MAX_MESSAGE_BYTES?.value).toBe("2097152");
      expect(env.TOOLMESH_STREAM_COMPRESSION?.value).toBe("none");
      expect(env.TOOLMESH_STREAM_REPLICAS?.value).toBe("1");
    }
  });

  it("are refused in a role's env or extraEnv, and in the global env, naming the value to use", async () => {
    await refuse(
      ["--set", "resolver.env.TOOLMESH_ACK_WAIT_MS=5000"],
      "resolver env or extraEnv sets TOOLMESH_ACK_WAIT_MS, which shapes the mesh's streams: set mesh.ackWaitMs instead",
    );
    await refuse(
      [
        "--set-json",
        'executors=[{"name":"x","extraEnv":[{"name":"TOOLMESH_MAX_QUEUED_CALLS","value":"5"}]}]',
      ],
      "executor-x env or extraEnv sets TOOLMESH_MAX_QUEUED_CALLS",
    );
    await refuse(
      ["--set", "env.TOOLMESH_STREAM_COMPRESSION=none"],
      "set mesh.streamCompression instead",
    );
    await refuse(
      [
        "--set",
        "gateway.enabled=true",
        "--set",
        "gateway.keys.existingSecret=keys",
        "--set",
        "gateway.env.TOOLMESH_STREAM_REPLICAS=3",
      ],
      "set setup.streamReplicas instead",
    );
    await refuse(
      ["--set", "executors[0].env.TOOLMESH_STORE_BYTES=1000"],
      "set mesh.storeBytes instead",
    );
    await refuse(["--set", "mesh.ackWait=5"], "additional properties 'ackWait' not allowed");
  });
});

describe("KEDA", () => {
  it("scales on the sum of the tools' lags against the executor's concurrency, with a fallback", async () => {
    const so = find(await render(["-f", HATCHES]), "ScaledObject", "executor-builtin");
    expect(so.spec.advanced.scalingModifiers).toEqual({
      formula: "lag0 + lag1",
      target: "8",
      activationTarget: "0",
      metricType: "AverageValue",
    });
    expect(so.spec.triggers.map((t: Manifest) => [t.name, t.metadata.consumer])).toEqual([
      ["lag0", "work_echo"],
      ["lag1", "work_add"],
    ]);
    expect(so.spec.fallback).toEqual({ failureThreshold: 3, replicas: 4 });
    const defaults = await render([
      "--set-json",
      'executors=[{"name":"x","autoscaling":{"mode":"keda","keda":{"tools":["echo"]}}}]',
    ]);
    expect(find(defaults, "ScaledObject", "executor-x").spec.advanced.scalingModifiers.target).toBe(
      "16",
    );
  });

  it("keeps a fully qualified monitoring endpoint as it is", async () => {
    const ms = await render([
      "--set",
      "nats.monitoringEndpoint=nats-headless.nats.svc.cluster.local:8222",
      "--set-json",
      'executors=[{"name":"x","autoscaling":{"mode":"keda","keda":{"tools":["echo"]}}}]',
    ]);
    expect(
      find(ms, "ScaledObject", "executor-x").spec.triggers[0].metadata.natsServerMonitoringEndpoint,
    ).toBe("nats-headless.nats.svc.cluster.local:8222");
  });
});

describe("egress to the endpoints the pods call", () => {
  it("opens the OTLP port to every role and the JWKS port to the gateway, plus a role's own rules", async () => {
    const ms = await render(["-f", HATCHES]);
    const egress = (suffix: string) => find(ms, "NetworkPolicy", suffix).spec.egress as Manifest[];
    for (const suffix of ["resolver", "schema-expander", "gateway", "executor-builtin"])
      expect(egress(suffix)).toContainEqual({ ports: [{ port: 4318, protocol: "TCP" }] });
    expect(egress("gateway")).toContainEqual({ ports: [{ port: 443, protocol: "TCP" }] });
    expect(egress("resolver")).not.toContainEqual({ ports: [{ port: 443, protocol: "TCP" }] });
    expect(egress("executor-builtin")).toContainEqual({
      to: [{ ipBlock: { cidr: "10.20.0.0/16" } }],
      ports: [{ port: 443, protocol: "TCP" }],
    });
    const peers = await render([
      "-f",
      HATCHES,
      "--set-json",
      'networkPolicy.otelPeers=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"observability"}}}]',
    ]);
    expect(find(peers, "NetworkPolicy", "resolver").spec.egress).toContainEqual({
      to: [
        { namespaceSelector: { matchLabels: { "kubernetes.io/metadata.name": "observability" } } },
      ],
      ports: [{ port: 4318, protocol: "TCP" }],
    });
  });

  it("opens the token endpoint's port to the roles that exchange tokens, and keeps their secrets out of env", async () => {
    const token = { TOOLMESH_TOKEN_URL: "https://login.example.com:8443/token" };
    const executors = [
      { name: "crm", env: token, secretEnv: { existingSecret: "crm-credentials" } },
    ];
    const ms = await render([
      "-f",
      HATCHES,
      "--set-json",
      `executors=${JSON.stringify(executors)}`,
      "--set-json",
      `gateway.env=${JSON.stringify({ ...token, TOOLMESH_GATEWAY_JWKS_URL: "https://login.example.com/jwks" })}`,
    ]);
    const egress = (suffix: string) => find(ms, "NetworkPolicy", suffix).spec.egress as Manifest[];
    for (const suffix of ["executor-crm", "gateway"])
      expect(egress(suffix)).toContainEqual({ ports: [{ port: 8443, protocol: "TCP" }] });
    expect(egress("resolver")).not.toContainEqual({ ports: [{ port: 8443, protocol: "TCP" }] });
    expect(containerOf(find(ms, "Deployment", "executor-crm")).envFrom).toContainEqual({
      secretRef: { name: "crm-credentials" },
    });
    for (const [variable, role] of [
      ["TOOLMESH_SECRET_KEYS", "executors[0]"],
      ["TOOLMESH_TOKEN_CLIENT_SECRET", "gateway"],
    ] as const) {
      const values =
        role === "gateway"
          ? ["-f", HATCHES, "--set", `gateway.env.${variable}=x`]
          : ["--set-json", `executors=[{"name":"crm","env":{"${variable}":"x"}}]`];
      await refuse(
        values,
        `${role === "gateway" ? "gateway" : "executor-crm"} env or extraEnv sets ${variable} as plain text: put it in a Secret`,
      );
    }
    // extraEnv: a literal value is refused the same way; one taken from a Secret is not.
    const extraEnv = (entry: Record<string, unknown>) => [
      "--set-json",
      `executors=${JSON.stringify([{ name: "crm", extraEnv: [{ name: "TOOLMESH_SECRET_KEYS", ...entry }] }])}`,
    ];
    await refuse(
      extraEnv({ value: "x" }),
      "executor-crm env or extraEnv sets TOOLMESH_SECRET_KEYS as plain text: put it in a Secret",
    );
    const fromSecret = { valueFrom: { secretKeyRef: { name: "crm-keys", key: "keys" } } };
    expect(
      containerOf(find(await render(extraEnv(fromSecret)), "Deployment", "executor-crm")).env,
    ).toContainEqual({
      name: "TOOLMESH_SECRET_KEYS",
      ...fromSecret,
    });
  });

  it("warns in the notes of an endpoint no egress rule reaches, and only then", async () => {
    const notes = async (args: string[]) => {
      const result = await helm([
        "install",
        "t",
        CHART,
        "--dry-run=client",
        "-f",
        HATCHES,
        ...args,
      ]);
      expect(result.code).toBe(0);
      return result.stdout.slice(result.stdout.indexOf("NOTES:"));
    };
    expect(await notes([])).not.toContain("WARNING");
    const off = await notes(["--set", "networkPolicy.deriveEgress=false"]);
    expect(off).toContain("WARNING: the NetworkPolicies drop traffic");
    expect(off).toContain(
      "t-toolmesh-resolver: otel.endpoint http://otel-collector.observability.svc:4318 has no egress rule",
    );
    expect(off).toContain(
      "t-toolmesh-gateway: the gateway's JWKS URL (TOOLMESH_GATEWAY_JWKS_URL) https://login.example.com/.well-known/jwks.json has no egress rule",
    );
    // The executor's own rule on 443 does not reach port 4318.
    expect(off).toContain("t-toolmesh-executor-builtin: otel.endpoint");
    const covered = await notes([
      "--set",
      "networkPolicy.deriveEgress=false",
      "--set-json",
      'networkPolicy.extraEgress=[{"ports":[{"port":4318,"protocol":"TCP"},{"port":443,"protocol":"TCP"}]}]',
    ]);
    expect(covered).not.toContain("WARNING");
  });
});

describe("versions and upgrade notes", () => {
  it("versions the chart apart from the app, with a README helm prints, UPGRADING and a CHANGELOG", async () => {
    const chart = parseYaml(readFileSync(`${CHART}/Chart.yaml`, "utf8")) as Record<string, string>;
    const changelog = readFileSync(`${CHART}/CHANGELOG.md`, "utf8");
    expect(changelog).toContain(`## ${chart.version} `);
    expect(changelog).toContain(`toolmesh ${chart.appVersion}`);
    const upgrading = readFileSync(`${CHART}/UPGRADING.md`, "utf8");
    expect(upgrading).toMatch(/version skew/i);
    const readme = await helm(["show", "readme", CHART]);
    expect(readme.code).toBe(0);
    expect(readme.stdout).toContain("# The toolmesh Helm chart");
    expect(readme.stdout).toContain("UPGRADING.md");
  });
});
