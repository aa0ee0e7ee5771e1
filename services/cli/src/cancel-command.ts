import type { Command } from "commander";
import type { RuntimeConfig } from "@toolmesh/runtime";
import { withClient } from "./commands.js";
import { say } from "./print.js";

/**
 * `toolmesh cancel <call-id> --session <id>`: exit 0 when cancelled, 1 when not (it had ended,
 * or no such call is known yet).
 */
export async function cancelCommand(
  config: RuntimeConfig,
  callId: string,
  options: { session: string; idempotencyKey?: string; json?: boolean },
): Promise<number> {
  return withClient(config, async (client) => {
    const session = client.session(options.session);
    try {
      const reply = await session.cancel(callId, options.idempotencyKey);
      if (options.json === true) say(JSON.stringify(reply));
      else if (reply.cancelled) say(`call ${callId} cancelled`);
      else if (reply.state === "done") say(`call ${callId} had already ended; nothing to cancel`);
      else if (reply.state === "pending")
        say(
          `no call ${callId} in session ${options.session} yet; one that arrives is answered cancelled (check the call id and --session)`,
        );
      else say(`cannot cancel call ${callId}: ${reply.error?.message ?? `it is ${reply.state}`}`);
      return reply.cancelled ? 0 : 1;
    } finally {
      session.close();
    }
  });
}

/** Registers `toolmesh cancel`. */
export function addCancelCommand(
  program: Command,
  config: () => RuntimeConfig,
  run: (command: () => Promise<number>) => void,
): void {
  program
    .command("cancel")
    .description("cancel a call: a queued call never runs, a running one is aborted")
    .argument("<call-id>", "the call's tool_call_id")
    .requiredOption("--session <id>", "the session the call belongs to")
    .option("--idempotency-key <key>", "the key the call was submitted with, if any")
    .option("--json", "print the cancel reply as JSON")
    .action((callId: string, o: { session: string; idempotencyKey?: string; json?: boolean }) =>
      run(() => cancelCommand(config(), callId, o)),
    );
}
