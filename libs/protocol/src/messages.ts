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
