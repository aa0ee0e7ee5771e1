import { createHash } from "node:crypto";
import type { ToolMessage } from "./envelopes.js";
import type { ToolmeshError } from "./errors.js";

/** Which call a tool message answers. */
export interface MessageTarget {
  tool_call_id: string;
  /** The tool's name ("" when the call named none). */
  name: string;
  session_id: string;
}

/** The final message of a failed call: the error as text for the model, typed for programs. */
export function errorToolMessage(
  target: MessageTarget,
  error: ToolmeshError,
  extra: { attempts?: number; duration_ms?: number } = {},
): ToolMessage {
  return {
    role: "tool",
    tool_call_id: target.tool_call_id,
    name: target.name,
    content: `Error: ${error.message}`,
    error: error.toWire(),
    session_id: target.session_id,
    ...extra,
  };
}

/**
 * The `args_hash` of a call's arguments as submitted: SHA-256 (hex) of `function.arguments`,
 * the JSON text when it is a string, else the object as `JSON.stringify` writes it. The call
 * store compares it to tell a retry from a conflicting reuse of a key, and final messages
 * carry it so a frontend can tell its own arguments' answer from another submission's.
 */
export function argumentsHash(args: unknown): string {
  const text = typeof args === "string" ? args : JSON.stringify(args);
  return createHash("sha256")
    .update(text ?? "")
    .digest("hex");
}
