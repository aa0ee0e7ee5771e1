import { describe, expect, it } from "vitest";
import { SUPPLEMENTED_SCHEMAS_HEADING, renderSupplementedSchemas } from "./supplemented.js";

const READ_FILE = {
  type: "object",
  properties: {
    path: { type: "string", description: "File path,\nrelative to the workspace." },
    encoding: { type: "string", enum: ["utf-8", "latin1"], default: "utf-8" },
    max_bytes: { type: "integer", description: "Stop after this many bytes." },
  },
  required: ["path", "max_bytes"],
};

describe("renderSupplementedSchemas", () => {
  it("renders nothing for no schemas", () => {
    expect(renderSupplementedSchemas([])).toBe("");
  });

  it("lists the full schema, marks required and missing params, and asks for a new call", () => {
    const text = renderSupplementedSchemas([
      {
        tool: "fs.read_file",
        parameters: READ_FILE,
        missing: ["path"],
        description: "Read a file from the workspace.",
      },
    ]);
    expect(text.startsWith(`${SUPPLEMENTED_SCHEMAS_HEADING}\n`)).toBe(true);
    expect(text).toContain("### `fs.read_file`\n\nRead a file from the workspace.");
    expect(text).toContain("Missing in your last call: `path`.");
    expect(text).toContain(
      "- `path` (string, **required**, **missing**) — File path, relative to the workspace.",
    );
    expect(text).toContain('- `encoding` (one of "utf-8", "latin1", optional, default "utf-8")');
    expect(text).toContain("- `max_bytes` (integer, **required**) — Stop after this many bytes.");
    expect(text).not.toMatch(/max_bytes[^\n]*\*\*missing\*\*/);
    const fenced = /```json\n([\s\S]*?)\n```/.exec(text)?.[1];
    expect(JSON.parse(fenced ?? "")).toEqual(READ_FILE);
    expect(text).toMatch(/call each tool again with every required parameter/i);
  });

  it("renders several tools, merges repeats, and shows missing names absent from the schema", () => {
    const text = renderSupplementedSchemas([
      { tool: "a", parameters: { type: "object", properties: { x: { type: "number" } } } },
      { tool: "b", parameters: { type: "object" }, missing: ["token"] },
      { tool: "a", parameters: { type: "object" }, missing: ["x"] },
    ]);
    expect(text.match(/^### /gm)).toHaveLength(2);
    expect(text.indexOf("### `a`")).toBeLessThan(text.indexOf("### `b`"));
    expect(text).toContain("- `x` (number, optional, **missing**)");
    expect(text).toContain("- `token` (**required**, **missing**)");
    expect(text).not.toContain("Missing in your last call: `x`, `x`");
  });

  it("keeps names with backticks and schemas with fences from breaking the markdown", () => {
    const text = renderSupplementedSchemas([
      {
        tool: "weird`name",
        parameters: { type: "object", properties: { q: { description: "no ``` here" } } },
      },
    ]);
    expect(text).toContain("### `` weird`name ``");
    const fenced = /```json\n([\s\S]*?)\n```/.exec(text)?.[1] ?? "";
    expect(fenced).not.toContain("`");
    expect(JSON.parse(fenced)).toEqual({
      type: "object",
      properties: { q: { description: "no ``` here" } },
    });
  });
});
