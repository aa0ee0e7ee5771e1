// The size limits of ADR 0049 on a real server whose max_payload is small (32 KiB), so that
// ordinary tools reach them: registrations held to their per-tool and per-owner limits, a
// catalog larger than one message read in pages, and a request over its kind's limit refused
// before any work.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { EMPTY_CATALOG_CONFIG, StateStore } from "@toolmesh/catalog";
import { ToolmeshClient } from "@toolmesh/client";
import { Defaults, ErrorCode, createSubjects, decodeJson, encodeJson } from "@toolmesh/protocol";
import type { ToolDefinitionInput } from "@toolmesh/protocol";
import { ToolRegistry } from "@toolmesh/registry";
import type { SchemaExpander } from "@toolmesh/schema-expander";
import { startSchemaExpander } from "@toolmesh/schema-expander";
import { createLogger, initTelemetry } from "@toolmesh/telemetry";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";

const subjects = createSubjects({ prefix: "siz" });
const log = createLogger({ service: "test", level: "silent" });
const MAX_PAYLOAD = 32 * 1024;
// Compact entries are about 200 bytes (summaries cut to 120 characters): 200 take two pages.
const TOOLS = 200;

let server: NatsServerHandle;
let nc: NatsConnection;
let registry: ToolRegistry;
let expander: SchemaExpander;
let client: ToolmeshClient;

const tool = (name: string, owner: string, extra: Partial<ToolDefinitionInput> = {}) => ({
  name,
  summary: `The tool ${name}, with a summary long enough to fill a page: ${"s".repeat(1_500)}`,
  kind: "builtin" as const,
  owner,
  parameters: { type: "object", properties: {} },
  ...extra,
});

beforeAll(async () => {
  server = await startNatsServer({ config: `max_payload: ${MAX_PAYLOAD}` });
  nc = await connect({ servers: server.url });
  registry = await ToolRegistry.open(nc, {
    subjects,
    log,
    limits: { toolsPerOwner: 3, ownerBytes: 16 * 1024 },
  });
  expander = await startSchemaExpander({
    nc,
    subjects,
    registry,
    store: await StateStore.open(nc, { subjects }),
    catalog: EMPTY_CATALOG_CONFIG,
    log,
    tracer: initTelemetry({ serviceName: "test", env: {} }).tracer,
  });
  client = new ToolmeshClient(nc, { prefix: "siz", defaultTimeoutMs: 10_000 });
}, 60_000);

afterAll(async () => {
  await expander?.stop(1_000);
  registry?.close();
  await nc?.close();
  await server?.stop();
});

describe("registration limits", () => {
  it("refuses a part of a tool over its limit with payload_too_large naming it", async () => {
    const cases: [Partial<ToolDefinitionInput>, string, number, number][] = [
      [{ description: "d".repeat(16 * 1024 + 1) }, "description", 16 * 1024 + 1, 16 * 1024],
      [
        { annotations: { note: "a".repeat(4 * 1024) } },
        "annotations",
        encodeJson({ note: "a".repeat(4 * 1024) }).length,
        Defaults.maxToolAnnotationsBytes,
      ],
    ];
    for (const [extra, field, bytes, limit] of cases) {
      await expect(registry.register(tool("big", "acme", extra))).rejects.toMatchObject({
        code: ErrorCode.PayloadTooLarge,
        retryable: false,
        details: { field, bytes, limit, tool: "big" },
      });
    }
    const properties = Object.fromEntries(
      Array.from({ length: 1_000 }, (_, i) => [
        `p${i}`,
        { type: "string", description: "x".repeat(60) },
      ]),
    );
    await expect(
      registry.register(tool("big", "acme", { parameters: { type: "object", properties } })),
    ).rejects.toMatchObject({
      code: ErrorCode.PayloadTooLarge,
      details: { field: "parameters", limit: Defaults.maxToolSchemaBytes },
    });
    expect(await registry.fetch("big")).toBeUndefined();
  });

  it("refuses an owner's tool past its number of tools or bytes with quota_exceeded", async () => {
    for (const name of ["few.a", "few.b", "few.c"]) {
      await registry.register(tool(name, "few", { summary: name }));
    }
    // An owner's tools are counted on the registry's live copy: wait until it holds them.
    await waitFor(() => ["few.a", "few.b", "few.c"].every((n) => registry.get(n) !== undefined));
    await expect(registry.register(tool("few.d", "few", { summary: "d" }))).rejects.toMatchObject({
      code: ErrorCode.QuotaExceeded,
      retryable: false,
      details: { scope: "few", quota: "owner_tools", limit: 3 },
    });
    // Updating one of its tools is no new tool: it is accepted.
    await expect(
      registry.register(tool("few.a", "few", { summary: "a, again" })),
    ).resolves.toMatchObject({ status: "updated" });

    await registry.register(tool("heavy.a", "heavy", { description: "h".repeat(10_000) }));
    await waitFor(() => registry.get("heavy.a") !== undefined);
    await expect(
      registry.register(tool("heavy.b", "heavy", { description: "h".repeat(10_000) })),
    ).rejects.toMatchObject({
      code: ErrorCode.QuotaExceeded,
      details: { scope: "heavy", quota: "owner_bytes", limit: 16 * 1024 },
    });
    expect(await registry.fetch("heavy.b")).toBeUndefined();
    for (const name of ["few.a", "few.b", "few.c", "heavy.a"])
      await registry.unregister(name, name.split(".")[0]!);
  });
});

describe("a catalog larger than one message", () => {
  it("comes in pages that the client reads whole", async () => {
    const names = Array.from({ length: TOOLS }, (_, i) => `t${String(i).padStart(3, "0")}`);
    // Owners of two tools each, under the per-owner limits of this registry.
    for (const [i, name] of names.entries()) await registry.register(tool(name, `o${i >> 1}`));
    await waitFor(() => [...registry.names()].filter((n) => names.includes(n)).length === TOOLS);

    const first = decodeJson(
      (await nc.request(subjects.catalogRpc("acme"), encodeJson({}), { timeout: 5_000 })).data,
    ) as { ok: true; tools: { name: string }[]; next_cursor?: string };
    expect(first.ok).toBe(true);
    expect(first.tools.length).toBeGreaterThan(0);
    expect(first.tools.length).toBeLessThan(TOOLS);
    expect(first.next_cursor).toBe(String(first.tools.length));

    const catalog = await client.catalog();
    expect(catalog.tools.map((t) => t.name)).toEqual(names);
    expect(catalog).not.toHaveProperty("next_cursor");
  });

  it("is not asked for with a request larger than max_payload: the client refuses to send it", async () => {
    await expect(client.catalog({ agent: "a".repeat(MAX_PAYLOAD) })).rejects.toMatchObject({
      code: ErrorCode.PayloadTooLarge,
      retryable: false,
      details: { field: "request", limit: MAX_PAYLOAD },
    });
  });
});

async function waitFor(condition: () => boolean): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error("condition not met within 10 s");
    await new Promise((resolve) => setImmediate(resolve));
  }
}
