import type { CallToolResult } from "@modelcontextprotocol/server";
import type { ToolMessage, WireError } from "@toolmesh/protocol";
import { ErrorCode } from "@toolmesh/protocol";
import type { ToolNames } from "./auth.js";
import { shownMessage } from "./tool-names.js";

/**
 * A mesh call's final message as an MCP tool result. A typed error is an `isError` result whose
 * `structuredContent` holds `code`, `message`, `retryable` and `details`; for
 * `missing_arguments` the text also names what is missing and carries the tool's full schema,
 * so a model that reads only text can call again. Tool names in it are the ones the client is
 * served (`names`).
 */
export function toCallToolResult(final: ToolMessage, names: ToolNames): CallToolResult {
  const message = shownMessage(final, names);
  if (message.error === undefined) {
    return { content: [{ type: "text", text: message.content }] };
  }
  const error = message.error;
  return {
    isError: true,
    content: [{ type: "text", text: errorText(message.content, error) }],
    structuredContent: {
      code: error.code,
      message: error.message,
      retryable: error.retryable,
      details: error.details ?? {},
    },
  };
}

function errorText(content: string, error: WireError): string {
  if (error.code !== ErrorCode.MissingArguments) return content;
  const details = error.details ?? {};
  const missing = Array.isArray(details.missing_required) ? details.missing_required : [];
  return (
    `${content}\nMissing required arguments: ${missing.join(", ")}\n` +
    `Input schema: ${JSON.stringify(details.parameters ?? {})}`
  );
}

/** An error the gateway itself answers (no mesh call was made) as an `isError` result. */
export function errorResult(error: WireError): CallToolResult {
  return {
    isError: true,
    content: [{ type: "text", text: `Error: ${error.message}` }],
    structuredContent: {
      code: error.code,
      message: error.message,
      retryable: error.retryable,
      details: error.details ?? {},
    },
  };
}
