import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { once } from "node:events";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import {
  ToolmeshClient,
  fromAnthropicContent,
  fromOpenAIToolCalls,
  toAnthropicTools,
  toOpenAITools,
} from "@toolmesh/client";
import type { Session } from "@toolmesh/client";
import type { ToolCall } from "@toolmesh/protocol";
import { PROVIDER_SAFE_NAME, safeToolName } from "@toolmesh/protocol";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import {
  fixtureTools,
  killAllServices,
  spawnService,
  startService,
  toolAvailable,
} from "./helpers/mesh.js";
import type { ServiceProcess } from "./helpers/mesh.js";

// Provider-safe tool names end to end: tools with dotted, long and colliding names, a catalog
// that serves safe names, the OpenAI and Anthropic formats, and every call mapped back.

const LONG =
  "openapi.petstore_v3.operations.find_pets_by_status_and_tags_with_pagination_and_sorting";
const NAMES = [
  "petstore.showPetById",
  "everything.get-sum",
  "calc.add",
  "mcp:git/log",
  LONG,
  `${LONG}.v2`,
  "plain_name",
];
// The patterns the providers document for function and tool names.
const OPENAI_FUNCTION_NAME = /^[a-zA-Z0-9_-]{1,64}$/;
const ANTHROPIC_TOOL_NAME = /^[a-zA-Z0-9_-]{1,64}$/;

let server: NatsServerHandle;
let nc: NatsConnection;
let client: ToolmeshClient;
let resolver: ServiceProcess;
let ids = 0;

beforeAll(async () => {
  server = await startNatsServer();
  const env = { NATS_URL: server.url, TOOLMESH_TOOLS_DIR: fixtureTools("tools-names") };
  resolver = await startService("resolver", env);
  await startService("executor", env);
  await startService("schema-expander", env);
  await toolAvailable(resolver, ...NAMES);
  nc = await connect({ servers: server.url });
  client = new ToolmeshClient(nc, { defaultTimeoutMs: 15_000 });
});

afterAll(async () => {
  await nc?.close();
  await killAllServices();
  await server?.stop();
});

/** Runs model calls in the mesh; each answer names the tool that ran. */
async function toolsReached(session: Session, calls: ToolCall[]): Promise<string[]> {
  const messages = await Promise.all(
    calls.map((call) => session.submit({ ...call, id: `c${ids++}` }).result),
  );
  return messages.map((message) => {
    expect(message.error).toBeUndefined();
    return (JSON.parse(message.content) as { tool: string }).tool;
  });
}

describe("provider-safe tool names", () => {
  it("refuses a tool whose safe name a registered tool has, and the executor says why", async () => {
    const colliding = spawnService("executor", {
      NATS_URL: server.url,
      TOOLMESH_TOOLS_DIR: fixtureTools("tools-names-collide"),
    });
    // A tool of the executor's own folder refused at start-up stops it, naming both tools.
    const code =
      colliding.child.exitCode ?? ((await once(colliding.child, "exit")) as [number | null])[0];
    expect(code).not.toBe(0);
    const said = `${colliding.stderr()}\n${JSON.stringify(colliding.lines)}`;
    expect(said).toMatch(/"calc_add".*provider-safe name.*"calc_add".*"calc\.add"/s);
    const catalog = await client.catalog();
    expect(catalog.tools.map((t) => t.name)).not.toContain("calc_add");
  });

  it("serves a catalog of safe names that map back to every tool", async () => {
    const session = client.session("s-safe");
    const catalog = await session.catalog({ names: "provider_safe" });
    expect(catalog.tools.map((t) => t.tool).sort()).toEqual([...NAMES].sort());
    for (const entry of catalog.tools) {
      expect(entry.name).toMatch(PROVIDER_SAFE_NAME);
      expect(entry.name).toBe(safeToolName(entry.tool ?? ""));
    }
    expect(new Set(catalog.tools.map((t) => t.name)).size).toBe(NAMES.length);
    // The long names keep a readable start and differ by their hash suffix.
    const long = catalog.tools.filter((t) => t.tool?.startsWith(LONG) === true);
    expect(long.map((t) => t.name.length)).toEqual([64, 64]);
    // A model's call by safe name reaches the tool named by `tool`.
    const reached = await toolsReached(
      session,
      catalog.tools.map((entry) => ({
        id: "",
        type: "function",
        function: { name: entry.tool ?? "", arguments: "{}" },
      })),
    );
    expect(reached).toEqual(catalog.tools.map((t) => t.tool));
    session.close();
  });

  it("gives OpenAI and Anthropic tool lists the same safe names, and maps each call back", async () => {
    const session = client.session("s-formats");
    const [catalog, safe] = await Promise.all([
      session.catalog(),
      session.catalog({ names: "provider_safe" }),
    ]);
    const openai = toOpenAITools(catalog.tools);
    const anthropic = toAnthropicTools(catalog.tools);
    const openaiNames = openai.tools.map((t) => t.function.name);
    const anthropicNames = anthropic.tools.map((t) => t.name);
    for (const name of openaiNames) expect(name).toMatch(OPENAI_FUNCTION_NAME);
    for (const name of anthropicNames) expect(name).toMatch(ANTHROPIC_TOOL_NAME);
    // One mapping: the formats name each tool as the safe-name catalog does.
    expect(openaiNames).toEqual(safe.tools.map((t) => t.name));
    expect(anthropicNames).toEqual(openaiNames);

    const fromOpenAI = fromOpenAIToolCalls(
      openaiNames.map((name, i) => ({
        id: `o${i}`,
        type: "function",
        function: { name, arguments: '{"note":"openai"}' },
      })),
      openai.nameMap,
    );
    expect(await toolsReached(session, fromOpenAI)).toEqual(catalog.tools.map((t) => t.name));
    const fromAnthropic = fromAnthropicContent(
      anthropicNames.map((name, i) => ({
        type: "tool_use",
        id: `a${i}`,
        name,
        input: { note: "anthropic" },
      })),
      anthropic.nameMap,
    );
    expect(await toolsReached(session, fromAnthropic)).toEqual(catalog.tools.map((t) => t.name));
    session.close();
  });
});
