/**
 * Unknown-field checks for rendered Kubernetes objects. kubernetes-models' `validate()` checks
 * types and formats but lets unknown fields through (the API server prunes or refuses them
 * depending on its field validation mode), so a misspelt field would pass silently. Its
 * TypeScript interfaces do list every field of the current API: the objects are written as
 * typed object literals and compiled, and TypeScript's excess-property check reports every
 * field, at any depth, that the API does not have.
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import ts from "typescript";

const repoRoot = join(dirname(fileURLToPath(import.meta.url)), "..", "..");

/** `apiVersion/kind` → the kubernetes-models module and interface of that kind. */
const TYPES: Record<string, [string, string]> = {
  "apps/v1/Deployment": ["kubernetes-models/apps/v1/Deployment", "IDeployment"],
  "batch/v1/Job": ["kubernetes-models/batch/v1/Job", "IJob"],
  "v1/ConfigMap": ["kubernetes-models/v1/ConfigMap", "IConfigMap"],
  "v1/Secret": ["kubernetes-models/v1/Secret", "ISecret"],
  "v1/Service": ["kubernetes-models/v1/Service", "IService"],
  "v1/ServiceAccount": ["kubernetes-models/v1/ServiceAccount", "IServiceAccount"],
  "v1/Pod": ["kubernetes-models/v1/Pod", "IPod"],
  "policy/v1/PodDisruptionBudget": [
    "kubernetes-models/policy/v1/PodDisruptionBudget",
    "IPodDisruptionBudget",
  ],
  "autoscaling/v2/HorizontalPodAutoscaler": [
    "kubernetes-models/autoscaling/v2/HorizontalPodAutoscaler",
    "IHorizontalPodAutoscaler",
  ],
  "networking.k8s.io/v1/Ingress": ["kubernetes-models/networking.k8s.io/v1/Ingress", "IIngress"],
  "networking.k8s.io/v1/NetworkPolicy": [
    "kubernetes-models/networking.k8s.io/v1/NetworkPolicy",
    "INetworkPolicy",
  ],
};

/** Whether the unknown-field check knows this kind. */
export function hasStrictType(apiVersion: string, kind: string): boolean {
  return `${apiVersion}/${kind}` in TYPES;
}

/**
 * Every problem TypeScript finds in the objects against their kubernetes-models interfaces, as
 * `Kind name: message` lines (empty when all match). Objects of kinds it does not know are
 * refused too.
 */
export function strictProblems(objects: readonly Record<string, unknown>[]): string[] {
  const dir = mkdtempSync(join(repoRoot, "test", ".k8s-strict-"));
  try {
    const imports = new Map<string, string>();
    const lines: string[] = [];
    const where: string[] = [];
    objects.forEach((o, i) => {
      const key = `${String(o.apiVersion)}/${String(o.kind)}`;
      const type = TYPES[key];
      if (type === undefined) throw new Error(`no TypeScript type for ${key}`);
      imports.set(type[1], type[0]);
      const name = (o.metadata as { name?: string } | undefined)?.name ?? "?";
      where.push(`${String(o.kind)} ${name}`);
      lines.push(`// object ${i}\nexport const o${i}: ${type[1]} = ${JSON.stringify(o, null, 1)};`);
    });
    const header = [...imports].map(([t, m]) => `import type { ${t} } from "${m}";`).join("\n");
    const file = join(dir, "objects.ts");
    const text = `${header}\n${lines.join("\n")}\n`;
    writeFileSync(file, text);
    const program = ts.createProgram([file], {
      strict: true,
      noEmit: true,
      skipLibCheck: true,
      module: ts.ModuleKind.NodeNext,
      moduleResolution: ts.ModuleResolutionKind.NodeNext,
      target: ts.ScriptTarget.ES2022,
      types: [],
    });
    const starts = [...text.matchAll(/^\/\/ object (\d+)$/gm)].map((m) => m.index);
    return ts.getPreEmitDiagnostics(program).map((d) => {
      const at = d.start ?? 0;
      const index = starts.filter((s) => s <= at).length - 1;
      const message = ts.flattenDiagnosticMessageText(d.messageText, " ");
      const line =
        d.file === undefined
          ? ""
          : text.slice(text.lastIndexOf("\n", at) + 1, text.indexOf("\n", at)).trim();
      return `${where[index] ?? "?"}: ${message} (at ${line})`;
    });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
