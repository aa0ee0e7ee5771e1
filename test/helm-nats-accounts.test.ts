// The "Kubernetes with accounts and TLS" guide (helm/toolmesh/README.md): the NATS chart's values,
// the cert-manager objects and the toolmesh values, checked against each other and against their
// schemas — the NATS chart's values (derived from its values.yaml: the chart publishes no schema
// and is not packaged where the tests can install it from), cert-manager's CRDs, Kubernetes' API
// types — and the toolmesh chart rendered and linted with the guide's values.
import { readFileSync } from "node:fs";
import { posix } from "node:path";
import { Ajv } from "ajv";
import { describe, expect, it } from "vitest";
import { parseAllDocuments, parse as parseYaml } from "yaml";
import { helm } from "./helpers/helm.js";
import { hasStrictType, strictProblems } from "./helpers/k8s-strict.js";

const CHART = "helm/toolmesh";
const GUIDE = "examples/deploy/nats-accounts-tls";
const TOOLMESH_VALUES = "examples/deploy/helm/accounts-tls-values.yaml";
type Manifest = Record<string, any>;

const ajv = new Ajv({ allErrors: true, strict: false });
const readJson = (file: string): object => JSON.parse(readFileSync(file, "utf8")) as object;
const validateNatsValues = ajv.compile(readJson("test/fixtures/nats-chart/values.schema.json"));
const validateCertManager = ajv.compile(readJson("test/fixtures/crds/cert-manager.schema.json"));
const natsValues = parseYaml(readFileSync(`${GUIDE}/nats-values.yaml`, "utf8")) as Manifest;
const certificates = parseAllDocuments(readFileSync(`${GUIDE}/certificates.yaml`, "utf8")).map(
  (d) => d.toJS() as Manifest,
);
const readme = readFileSync(`${CHART}/README.md`, "utf8");
const guide = readme.slice(readme.indexOf("## Kubernetes with accounts and TLS"));

const certificate = (secretName: string): Manifest => {
  const found = certificates.find(
    (c) => c.kind === "Certificate" && c.spec.secretName === secretName,
  );
  if (!found) throw new Error(`no Certificate makes the Secret ${secretName}`);
  return found;
};

async function renderToolmesh(): Promise<Manifest[]> {
  const result = await helm(["template", "toolmesh", CHART, "-f", TOOLMESH_VALUES]);
  expect(result.stderr).toBe("");
  expect(result.code).toBe(0);
  return parseAllDocuments(result.stdout)
    .map((d) => d.toJS() as Manifest | null)
    .filter((m): m is Manifest => m !== null);
}

describe("the NATS chart's values", () => {
  it("use only values the NATS chart defines, and the check refuses a misspelt one", () => {
    expect(validateNatsValues(natsValues), ajv.errorsText(validateNatsValues.errors)).toBe(true);
    const misspelt = { ...natsValues, config: { ...natsValues.config, jetStream: {} } };
    expect(validateNatsValues(misspelt)).toBe(false);
  });

  it("include the passwords and the accounts in one file, from a Secret mounted where the reloader watches", () => {
    const includes = Object.entries(natsValues.config.merge as Record<string, string>)
      .filter(([key]) => key.endsWith("$include"))
      .sort(([a], [b]) => a.localeCompare(b))
      .map(([, file]) => posix.join("/etc/nats-config", file));
    expect(includes).toEqual(["/etc/toolmesh-auth/auth.conf"]);
    const mount = (natsValues.container.patch as Manifest[]).find(
      (p) => p.path === "/volumeMounts/-",
    )?.value as Manifest;
    expect(mount).toMatchObject({ mountPath: "/etc/toolmesh-auth", readOnly: true });
    // The chart's reloader mounts and watches the NATS container's mounts under /etc/.
    expect(mount.mountPath.startsWith("/etc/")).toBe(true);
    const volume = (natsValues.podTemplate.patch as Manifest[]).find(
      (p) => p.path === "/spec/volumes/-",
    )?.value as Manifest;
    expect(volume).toEqual({
      name: mount.name,
      secret: { secretName: "toolmesh-nats-accounts" },
    });
    expect(guide).toContain(
      "cat secrets.conf accounts.conf > auth.conf\nkubectl create secret generic toolmesh-nats-accounts --namespace nats --from-file=auth.conf",
    );
  });

  it("require client certificates of the CA that issues the roles' certificates", () => {
    const server = certificate(natsValues.config.nats.tls.secretName as string);
    expect(natsValues.config.nats.tls).toMatchObject({ enabled: true, merge: { verify: true } });
    expect(natsValues.config.cluster.tls.secretName).toBe(server.spec.secretName);
    expect(natsValues.tlsCA).toMatchObject({ enabled: true, secretName: server.spec.secretName });
    expect(server.spec.usages).toEqual(expect.arrayContaining(["server auth", "client auth"]));
    for (const c of certificates.filter((c) => c.kind === "Certificate" && !c.spec.isCA))
      expect(c.spec.issuerRef).toEqual(server.spec.issuerRef);
  });
});

describe("the cert-manager objects", () => {
  it("match cert-manager's schemas, and the check refuses a misspelt field", () => {
    for (const c of certificates)
      expect(
        validateCertManager(c),
        `${c.kind} ${c.metadata.name}: ${ajv.errorsText(validateCertManager.errors)}`,
      ).toBe(true);
    const bad = structuredClone(certificate("nats-server-tls"));
    bad.spec.dnsName = bad.spec.dnsNames;
    expect(validateCertManager(bad)).toBe(false);
  });

  it("name, in the servers' certificate, the hosts the toolmesh values connect to", () => {
    const values = parseYaml(readFileSync(TOOLMESH_VALUES, "utf8")) as Manifest;
    const dnsNames = certificate("nats-server-tls").spec.dnsNames as string[];
    expect(dnsNames).toContain(new URL(values.nats.url as string).hostname);
    // Each server behind the headless Service, as routes and KEDA reach them.
    expect(dnsNames).toContain("*.nats-headless.nats.svc.cluster.local");
  });
});

describe("the toolmesh values", () => {
  it("pass helm lint --strict and render objects of the current API with no unknown field", async () => {
    const lint = await helm(["lint", "--strict", CHART, "-f", TOOLMESH_VALUES]);
    expect(lint.stdout + lint.stderr).toContain("0 chart(s) failed");
    const manifests = await renderToolmesh();
    expect(strictProblems(manifests.filter((m) => hasStrictType(m.apiVersion, m.kind)))).toEqual(
      [],
    );
  }, 60_000);

  it("give every pod its own user's password Secret and its own certificate, as the guide's table says", async () => {
    const manifests = await renderToolmesh();
    const pods = manifests.filter((m) => m.kind === "Deployment" || m.kind === "Job");
    expect(pods.length).toBeGreaterThanOrEqual(5);
    const rows = new Map(
      [...guide.matchAll(/^\| [^|]+\| `([a-z-]+)` +\| `([a-z-]+)` +\| `([a-z-]+-tls)` +\|$/gm)].map(
        (m) => [m[2] as string, { user: m[1] as string, tls: m[3] as string }],
      ),
    );
    expect(rows.size).toBe(6);
    const seen = new Set<string>();
    for (const pod of pods) {
      const spec = pod.spec.template.spec as Manifest;
      const env = spec.containers[0].env as Manifest[];
      const secretOf = (name: string) =>
        env.find((e) => e.name === name)?.valueFrom?.secretKeyRef?.name as string;
      const auth = secretOf("NATS_USER");
      expect(secretOf("NATS_PASSWORD")).toBe(auth);
      const row = rows.get(auth);
      expect(
        row,
        `${pod.metadata.name as string}: ${auth} is not in the guide's table`,
      ).toBeDefined();
      const tls = (spec.volumes as Manifest[]).find((v) => v.name === "nats-tls")?.secret;
      expect(tls.secretName).toBe(row?.tls);
      const cert = certificate(row?.tls ?? "");
      expect(cert.metadata.namespace).toBe("toolmesh");
      expect(cert.spec.usages).toEqual(["client auth"]);
      expect(tls.items.map((i: Manifest) => i.key)).toEqual(["ca.crt", "tls.crt", "tls.key"]);
      seen.add(auth);
    }
    expect(seen.size).toBeGreaterThanOrEqual(5);
  });

  it("make a password for every user the accounts file asks for, and a Secret of each role's", () => {
    const asked = new Set(
      [
        ...readFileSync("deploy/nats/toolmesh.conf", "utf8").matchAll(
          /\$(TOOLMESH_[A-Z_]+_PASSWORD)/g,
        ),
      ].map((m) => m[1]),
    );
    const users = /for user in ([a-z -]+); do\n {2}var=/.exec(guide)?.[1]?.split(" ") ?? [];
    const made = new Set(
      users.map((u) => `TOOLMESH_${u.toUpperCase().replaceAll("-", "_")}_PASSWORD`),
    );
    expect(made).toEqual(asked);
    const roles =
      /for user in ([a-z -]+); do\n {2}kubectl create secret generic "toolmesh-nats-\$user"/
        .exec(guide)?.[1]
        ?.split(" ");
    expect(roles).toHaveLength(6);
    expect(asked.size).toBe(9);
    expect(new Set(roles)).toEqual(
      new Set(
        [...guide.matchAll(/^\| [^|]+\| `([a-z-]+)` +\| `toolmesh-nats-/gm)].map((m) => m[1]),
      ),
    );
  });

  it("reload every server a second time after the reloader, when a tenant is added", () => {
    expect(guide).toContain("toolmesh auth config --tenants default,newco > accounts.conf");
    expect(guide).toContain("nats-server --signal reload=/var/run/nats/nats.pid");
    expect(guide).toContain(`--set-json 'setup.tenants=["default","newco"]'`);
  });
});
