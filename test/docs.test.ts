import { execFileSync } from "node:child_process";
import { readFileSync, readdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { ErrorCode, subjectToken } from "@toolmesh/protocol";
import { EnvSchema } from "@toolmesh/runtime";
import { initMetrics, toolmeshMetrics } from "@toolmesh/telemetry";
import { describe, expect, it } from "vitest";

// Keeps the documentation in step with the code it describes. Reads files (and runs the
// documented Python with python3, and scrapes a local /metrics); no network.

const root = join(dirname(fileURLToPath(import.meta.url)), "..");

function readDoc(path: string): string {
  return readFileSync(join(root, path), "utf8");
}

describe("docs/errors.md", () => {
  const headings = [...readDoc("docs/errors.md").matchAll(/^## `([^`]+)`[ \t]*$/gm)].map(
    (match) => match[1] ?? "",
  );
  const codes: string[] = Object.values(ErrorCode);

  it("has a `## `code`` section for every ErrorCode value", () => {
    expect(codes.filter((code) => !headings.includes(code))).toEqual([]);
  });

  it("has no section for a code that does not exist", () => {
    expect(headings.filter((heading) => !codes.includes(heading))).toEqual([]);
  });

  it("has one section per code", () => {
    expect(headings.filter((heading, i) => headings.indexOf(heading) !== i)).toEqual([]);
  });
});

describe("README.md", () => {
  const readme = readDoc("README.md");

  it("documents every environment variable of EnvSchema", () => {
    const variables = Object.keys(EnvSchema.shape);
    expect(variables.length).toBeGreaterThan(0);
    expect(variables.filter((name) => !readme.includes(`\`${name}\``))).toEqual([]);
  });

  it("names each histogram of its metrics table as /metrics serves it", async () => {
    // The names in the first cell of each row whose type says histogram.
    const documented = [...readme.matchAll(/^\| (`toolmesh_[^|]*)\| [^|]*histogram/gm)].flatMap(
      (row) => [...(row[1] ?? "").matchAll(/`(toolmesh_[a-z_]+)`/g)].map((name) => name[1]),
    );
    expect(documented.length).toBeGreaterThan(3);
    const metrics = await initMetrics({ serviceName: "docs", env: {}, prometheusPort: 0 });
    try {
      const m = toolmeshMetrics();
      m.attemptStarted("echo", 0.01);
      m.callEnded("echo", undefined, 0.2);
      m.approvalDecided("approve", 3);
      m.mcpRequest("fx", "tools/call", 0.1, undefined);
      m.gatewayCallEnded("acme", "echo", "ok", 0.3);
      const text = await (await fetch(`http://127.0.0.1:${metrics.prometheusPort}/metrics`)).text();
      const served = [...text.matchAll(/^# TYPE (\S+) /gm)].map((match) => match[1]);
      expect(documented.filter((name) => !served.includes(name))).toEqual([]);
    } finally {
      await metrics.shutdown();
    }
  });
});

describe("docs/protocol.md", () => {
  const protocol = readDoc("docs/protocol.md");
  const schemaFiles = readdirSync(join(root, "schemas"));

  it("links every file in schemas/", () => {
    expect(schemaFiles.length).toBeGreaterThan(0);
    expect(schemaFiles.filter((file) => !protocol.includes(`](../schemas/${file})`))).toEqual([]);
  });

  it("shows a Python subject_token that gives the tokens subjectToken gives", () => {
    const snippet = /A Python version[\s\S]*?```python\n([\s\S]*?)```/.exec(protocol)?.[1];
    expect(snippet).toContain("def subject_token(");
    const names = [
      "default",
      "acme corp",
      "s.1",
      "a*b>c",
      "tab\there",
      "=",
      "a==b",
      "é",
      "日本語",
      "🙂 emoji",
      "\ud800 lone high",
      "lone low \udfff",
      "x".repeat(64),
      "x".repeat(65),
      "é".repeat(40),
      "\ud83d".repeat(30),
    ];
    const program = `${snippet ?? ""}
import json, sys
print(json.dumps([subject_token(n) for n in json.loads(sys.stdin.read())]))
`;
    const out = execFileSync("python3", ["-c", program], {
      input: JSON.stringify(names),
      encoding: "utf8",
    });
    expect(JSON.parse(out)).toEqual(names.map((name) => subjectToken(name)));
  });

  it("links no schema file that does not exist", () => {
    const linked = [...protocol.matchAll(/\]\(\.\.\/schemas\/([^)#]+\.json)\)/g)].map(
      (match) => match[1] ?? "",
    );
    expect(linked.filter((file) => !schemaFiles.includes(file))).toEqual([]);
  });
});
