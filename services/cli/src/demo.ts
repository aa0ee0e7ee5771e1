import type { NatsConnection } from "@nats-io/nats-core";
import type { CallInput } from "@toolmesh/client";
import { ToolmeshClient } from "@toolmesh/client";
import { runExpansionDemo } from "./expansion-demo.js";
import type { ToolMessage } from "@toolmesh/protocol";
import { describeMessage, say } from "./print.js";

/** One scripted step of the demo. */
interface DemoStep {
  title: string;
  call: CallInput & { name: string; arguments: string };
  /** The error code the step should end with, or "ok". */
  expect: string;
  /** Also show the resolved-call record (defaults and their sources). */
  showResolution?: boolean;
}

const STEPS: DemoStep[] = [
  {
    title: "a successful call",
    call: { id: "demo-echo", name: "echo", arguments: '{"text":"hello from toolmesh"}' },
    expect: "ok",
  },
  {
    title: "a call with defaults filled (the example tool optimize_structure)",
    call: {
      id: "demo-optimize",
      name: "optimize_structure",
      arguments: JSON.stringify({
        input_structure: "https://example.org/Cu_bulk.cif",
        model_path: "https://example.org/dpa-2.4-7M.pt",
        relax_cell: false,
      }),
    },
    expect: "ok",
    showResolution: true,
  },
  {
    title: "a call missing a required argument",
    call: { id: "demo-weather", name: "get_weather", arguments: '{"days": 2}' },
    expect: "missing_arguments",
  },
  {
    title: "an invalid call: arguments that are not JSON",
    call: { id: "demo-bad-json", name: "echo", arguments: '{"text": "unterminated' },
    expect: "invalid_arguments",
  },
  {
    title: "an invalid call: a tool that does not exist",
    call: { id: "demo-unknown", name: "get_wether", arguments: '{"city":"Paris"}' },
    expect: "unknown_tool",
  },
];

/**
 * Walks through the demo against a running mesh and prints what each call returned.
 * Returns the number of steps whose outcome was not the one expected.
 */
export async function runDemo(
  nc: NatsConnection,
  options: { prefix: string; tenant: string },
): Promise<number> {
  const client = new ToolmeshClient(nc, {
    prefix: options.prefix,
    tenant: options.tenant,
    defaultTimeoutMs: 20_000,
  });
  const session = client.session(`demo-${Date.now().toString(36)}`);
  let surprises = 0;
  try {
    for (const [i, step] of STEPS.entries()) {
      say(`\n── ${i + 1}. ${step.title}`);
      say(`   call: ${step.call.name} ${step.call.arguments}`);
      if (step.showResolution === true) {
        const reply = await client.resolve(session.id, step.call);
        if (reply.ok) {
          say("   input_parameters:");
          for (const p of reply.resolved.input_parameters) {
            say(
              `     ${p.name.padEnd(16)} ${p.type.padEnd(5)} ${JSON.stringify(p.value).padEnd(40)} (${p.source})`,
            );
          }
        }
      }
      const message: ToolMessage = await session.submit(step.call).result;
      say(
        `   ${message.error === undefined ? "result" : "error"}: ${indent(describeMessage(message))}`,
      );
      const outcome = message.error?.code ?? "ok";
      if (outcome !== step.expect) surprises++;
    }
  } finally {
    session.close();
  }
  surprises += await runExpansionDemo(client, STEPS.length + 1);
  say(
    surprises === 0
      ? "\ndemo finished: every call ended as expected"
      : `\ndemo finished: ${surprises} unexpected outcome(s)`,
  );
  return surprises;
}

function indent(text: string): string {
  return text.split("\n").join("\n   ");
}
