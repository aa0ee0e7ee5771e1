import type { ToolMessage } from "@toolmesh/protocol";
import { retryAfterMs } from "@toolmesh/client";
import { ToolmeshError } from "@toolmesh/protocol";
import { permissionViolation } from "./denied.js";

/** Writes a line to stdout. The CLI's only way to talk to people. */
export function say(text = ""): void {
  process.stdout.write(`${text}\n`);
}

/** A final message for people: the content, or the error code and message. */
export function describeMessage(message: ToolMessage): string {
  if (message.error === undefined) return message.content;
  const details =
    message.error.details === undefined
      ? ""
      : `\n${JSON.stringify(message.error.details, null, 2)}`;
  const after = retryAfterMs(message);
  const retry = after === undefined ? "" : ` (retry after ${after} ms)`;
  return `${message.error.code}: ${message.error.message}${retry}${details}`;
}

/**
 * Prints a typed error — `{"error": …}` with `--json`, else `code: message` — and returns exit
 * code 1. Anything else is rethrown for the CLI's top level (exit 2), and so is a typed error
 * NATS's refusal of a permission is behind: a failure of the user's rights, not an answer.
 */
export function typedFailure(err: unknown, json: boolean | undefined): number {
  if (!(err instanceof ToolmeshError) || permissionViolation(err) !== undefined) throw err;
  say(json === true ? JSON.stringify({ error: err.toWire() }) : `${err.code}: ${err.message}`);
  return 1;
}
