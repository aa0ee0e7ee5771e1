import { describe, expect, it } from "vitest";
import type { Tool } from "@modelcontextprotocol/client";
import type { ToolContext } from "@toolmesh/tool-host";
import { ToolDefinitionSchema, ToolmeshError } from "@toolmesh/protocol";
import type { ToolDefinition } from "@toolmesh/protocol";
import { parseServerFile } from "./config.js";
import type { McpServerConfig } from "./config.js";
import {
  definitionNotApproved,
  lazyCatalog,
  mcpToolModule,
  ownerOf,
  toolFromDefinition,
} from "./served-server.js";

const server = (extra: Record<string, unknown> = {}): McpServerConfig =>
  parseServerFile(
    JSON.stringify({ name: "files", transport: "stdio", command: "node", ...extra }),
    "files.json",
  );

const definition = (fields: Partial<ToolDefinition>): ToolDefinition =>
  ToolDefinitionSchema.parse({
    description: "",
    summary: "",
    kind: "mcp",
    parameters: { type: "object" },
    owner: ownerOf("files"),
    ...fields,
  });

describe("mcpToolModule", () => {
  const tool: Tool = {
    name: "read",
    title: "Read a file",
    description: "reads",
    inputSchema: { type: "object", properties: { path: { type: "string" } } },
    annotations: { readOnlyHint: true },
  };

  it("names the tool <server>.<tool>, keeps its schema and hints and takes the server's settings", () => {
    const config = server({ timeout_ms: 1234, groups: ["fs"] });
    const module = mcpToolModule(config, tool, () => Promise.resolve(""));
    expect(module).toMatchObject({
      name: "files.read",
      description: "reads",
      parameters: tool.inputSchema,
      kind: "mcp",
      progress: true,
      systemParams: [],
      annotations: { readOnlyHint: true, title: "Read a file" },
      origin: { server: "files", tool: "read", transport: "stdio" },
      groups: ["fs"],
      timeoutMs: 1234,
    });
  });

  it("leaves out what neither the tool nor the server sets", () => {
    const module = mcpToolModule(server(), { name: "bare", inputSchema: { type: "object" } }, () =>
      Promise.resolve(""),
    );
    expect(module.description).toBe("");
    expect(module).not.toHaveProperty("annotations");
    expect(module).not.toHaveProperty("timeoutMs");
    expect(module).not.toHaveProperty("groups");
  });

  it("invokes the server's own tool name with the call's arguments", async () => {
    const seen: unknown[] = [];
    const module = mcpToolModule(server(), tool, (name, args) => {
      seen.push(name, args);
      return Promise.resolve("done");
    });
    const result = await module.handler({ path: "/a" }, {} as ToolContext);
    expect(result).toBe("done");
    expect(seen).toEqual(["read", { path: "/a" }]);
  });
});

describe("definitionNotApproved", () => {
  it("is a non-retryable tool_disabled naming the approve command", () => {
    const err = definitionNotApproved("files", "read");
    expect(err).toBeInstanceOf(ToolmeshError);
    expect(err.code).toBe("tool_disabled");
    expect(err.retryable).toBe(false);
    expect(err.message).toContain("toolmesh tools approve files read");
    expect(err.details).toEqual({
      tool: "files.read",
      server: "files",
      reason: "definition_not_approved",
    });
  });
});

describe("lazyCatalog", () => {
  const registered = [
    definition({ name: "files.read", origin: { server: "files", tool: "read" } }),
    definition({ name: "files.other_owner", owner: "someone", origin: { server: "files" } }),
    definition({ name: "git.log", owner: ownerOf("git"), origin: { server: "git" } }),
  ];

  it("takes the server's own registry entries first", () => {
    const tools = lazyCatalog(server({ lazy: true }), registered, ownerOf("files"));
    expect(tools?.map((t) => t.name)).toEqual(["read"]);
  });

  it("falls back to the file's tools, then to nothing", () => {
    const withTools = server({
      lazy: true,
      tools: [{ name: "list", description: "lists", inputSchema: { type: "object" } }],
    });
    expect(lazyCatalog(withTools, [], ownerOf("files"))).toEqual([
      { name: "list", description: "lists", inputSchema: { type: "object" } },
    ]);
    expect(lazyCatalog(server({ lazy: true }), [], ownerOf("files"))).toBeUndefined();
  });
});

describe("toolFromDefinition", () => {
  it("takes the MCP name from the origin, else strips the server's prefix", () => {
    expect(
      toolFromDefinition(definition({ name: "files.x", origin: { tool: "read" } }), "files").name,
    ).toBe("read");
    expect(toolFromDefinition(definition({ name: "files.write" }), "files").name).toBe("write");
    expect(toolFromDefinition(definition({ name: "plain" }), "files").name).toBe("plain");
  });
});
