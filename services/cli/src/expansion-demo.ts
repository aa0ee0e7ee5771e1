import type {
  Catalog,
  FormattedCatalog,
  ModelConfig,
  OpenAIToolCallInput,
  Session,
  ToolmeshClient,
} from "@toolmesh/client";
import { formatCatalogFor, fromOpenAIToolCalls } from "@toolmesh/client";
import type { ToolMessage } from "@toolmesh/protocol";
import { ToolmeshError } from "@toolmesh/protocol";
import { say } from "./print.js";

/** The agent the demo binds its session to (`configs/agents/weather-assistant.yaml`). */
const DEMO_AGENT = "weather-assistant";

/** The scripted model: a model with native function calling, answering in OpenAI's shape. */
const MODEL: ModelConfig = { provider: "openai", supportsFunctionCalling: true };

/** What the scripted model answers on each turn. */
const TRANSCRIPT: { thinks: string; toolCalls: OpenAIToolCallInput[] }[] = [
  {
    thinks:
      "the user wants the weather in Lyon; get_weather fits, but I have not seen its parameters",
    toolCalls: [
      {
        id: "turn1-0",
        type: "function",
        function: { name: "get_weather", arguments: '{"days":2}' },
      },
    ],
  },
  {
    thinks: "the schema says `city` is required",
    toolCalls: [
      {
        id: "turn2-0",
        type: "function",
        function: { name: "get_weather", arguments: '{"city":"Lyon","days":2}' },
      },
    ],
  },
];

/**
 * The schema-expansion part of the demo (docs/protocol.md#schema-expansion-catalog-and-tool-groups), with a scripted model: the compact catalog,
 * a call with a required argument missing, the full schema arriving on the session, the
 * corrected call and its result; then tool groups and the session's agent binding. Returns the
 * number of steps that did not end as expected.
 */
export async function runExpansionDemo(client: ToolmeshClient, firstStep: number): Promise<number> {
  const session = client.session(`demo-expansion-${Date.now().toString(36)}`);
  let surprises = 0;
  const expect = (outcome: string, wanted: string): void => {
    if (outcome !== wanted) {
      surprises++;
      say(`   !! expected ${wanted}, got ${outcome}`);
    }
  };
  try {
    say(
      `\n── ${firstStep}. schema expansion: compact catalog → incomplete call → schema → corrected call`,
    );
    const { catalog, bound } = await openCatalog(session);
    say(`   compact catalog${bound ? ` of agent ${DEMO_AGENT} (session bound to it)` : ""}:`);
    for (const tool of catalog.tools) say(`     ${tool.name.padEnd(18)} ${tool.summary}`);
    let formatted = formatCatalogFor(
      { ...MODEL, outputStrategy: catalog.output_strategy },
      catalog.tools,
    );
    say(`   output strategy: ${describeFormat(formatted)}`);

    let message = await modelTurn(session, formatted, 0);
    expect(message.error?.code ?? "ok", "missing_arguments");
    const arrived = await session.waitForSchema("get_weather", 10_000);
    expect(arrived ? "schema" : "no schema", "schema");
    const supplemented = session.takeSupplementedSchemas();
    say(
      `   schema event: ${supplemented.map((s) => `${s.tool} (missing: ${(s.missing ?? []).join(", ")})`).join("; ")}`,
    );
    formatted = formatCatalogFor(
      { ...MODEL, outputStrategy: catalog.output_strategy },
      session.withReceivedSchemas(catalog.tools),
      { supplemented },
    );
    say("   next turn's system prompt gets:");
    say(indent(formatted.supplement, "     │ "));
    message = await modelTurn(session, formatted, 1);
    expect(message.error?.code ?? "ok", "ok");

    say(`\n── ${firstStep + 1}. tool groups: this session switches group "web" off`);
    await session.setGroups({ disable: ["web"] });
    const without = await session.catalog();
    say(`   catalog now: ${without.tools.map((t) => t.name).join(", ") || "(empty)"}`);
    message = await session.submit({
      id: "groups-0",
      name: "get_weather",
      arguments: { city: "Lyon" },
    }).result;
    say(`   call: get_weather {"city":"Lyon"}\n   ${outcomeLine(message)}`);
    expect(message.error?.code ?? "ok", "tool_disabled");
    await session.setGroups({ reset: ["web"] });
    say('   group "web" reset: active again');

    if (bound) {
      say(`\n── ${firstStep + 2}. agents: the session is bound to ${DEMO_AGENT}`);
      message = await session.submit({
        id: "agent-0",
        name: "optimize_structure",
        arguments: { input_structure: "Cu.cif", model_path: "dpa.pt" },
      }).result;
      say(`   call: optimize_structure\n   ${outcomeLine(message)}`);
      expect(message.error?.code ?? "ok", "permission_denied");
    }
  } catch (err) {
    surprises++;
    say(`   !! ${err instanceof Error ? err.message : String(err)}`);
  } finally {
    session.close();
  }
  return surprises;
}

/** The session's catalog, bound to the demo agent when the configuration defines it. */
async function openCatalog(session: Session): Promise<{ catalog: Catalog; bound: boolean }> {
  try {
    return { catalog: await session.catalog({ agent: DEMO_AGENT, bindAgent: true }), bound: true };
  } catch (err) {
    if (!(err instanceof ToolmeshError) || err.code === "unavailable") throw err;
    say(`   (agent ${DEMO_AGENT} is not configured in TOOLMESH_CONFIG_DIR: the whole catalog)`);
    return { catalog: await session.catalog(), bound: false };
  }
}

/** One turn of the scripted model: its tool calls go to the mesh; the first result is shown. */
async function modelTurn(
  session: Session,
  formatted: FormattedCatalog,
  turn: number,
): Promise<ToolMessage> {
  const script = TRANSCRIPT[turn];
  if (script === undefined) throw new Error(`the transcript has no turn ${turn + 1}`);
  const nameMap = formatted.strategy === "native" ? formatted.nameMap : undefined;
  const [call] = fromOpenAIToolCalls(script.toolCalls, nameMap);
  if (call === undefined) throw new Error(`turn ${turn + 1} makes no call`);
  say(`   model, turn ${turn + 1} (${script.thinks}):`);
  const args = call.function.arguments;
  say(`   call: ${call.function.name} ${typeof args === "string" ? args : JSON.stringify(args)}`);
  const message = await session.submit(call).result;
  say(`   ${outcomeLine(message)}`);
  return message;
}

/** `result: …` or `error: code: message` (the details are in the schema event, not repeated). */
function outcomeLine(message: ToolMessage): string {
  if (message.error === undefined) return `result: ${message.content}`;
  return `error: ${message.error.code}: ${message.error.message}`;
}

function describeFormat(formatted: FormattedCatalog): string {
  if (formatted.strategy === "structured") return "structured output (tools in the prompt)";
  const declared = formatted.tools.length;
  return `native function calling (${formatted.provider}), ${declared} tool${declared === 1 ? "" : "s"} declared without parameters until needed`;
}

function indent(text: string, prefix: string): string {
  return text
    .split("\n")
    .map((line) => `${prefix}${line}`)
    .join("\n");
}
