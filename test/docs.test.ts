import { readFileSync, readdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { ErrorCode } from "@toolmesh/protocol";
import { EnvSchema } from "@toolmesh/runtime";
import { describe, expect, it } from "vitest";

// Keeps the documentation in step with the code it describes. Reads files only; no network.

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
});

describe("docs/protocol.md", () => {
  const protocol = readDoc("docs/protocol.md");
  const schemaFiles = readdirSync(join(root, "schemas"));

  it("links every file in schemas/", () => {
    expect(schemaFiles.length).toBeGreaterThan(0);
    expect(schemaFiles.filter((file) => !protocol.includes(`](../schemas/${file})`))).toEqual([]);
  });

  it("links no schema file that does not exist", () => {
    const linked = [...protocol.matchAll(/\]\(\.\.\/schemas\/([^)#]+\.json)\)/g)].map(
      (match) => match[1] ?? "",
    );
    expect(linked.filter((file) => !schemaFiles.includes(file))).toEqual([]);
  });
});
