import type { ToolMessage } from "@toolmesh/protocol";
import { safeToolName } from "@toolmesh/protocol";
import type { ToolNames } from "./auth.js";

/**
 * A call's final message as a client served `names` sees it: with provider-safe names, the
 * tool's name, the `tool` and `close_matches` of the error's details, and those names where the
 * error's text quotes them (`tool "calc.add" is missing …`) are their safe forms, so a model
 * that reads the error calls again by the name it was shown.
 */
export function shownMessage(message: ToolMessage, names: ToolNames): ToolMessage {
  if (names === "mesh") return message;
  const shown = { ...message, name: safeToolName(message.name) };
  if (message.error === undefined) return shown;
  const details = message.error.details ?? {};
  const matches = Array.isArray(details.close_matches)
    ? details.close_matches.filter((m): m is string => typeof m === "string")
    : [];
  const quoted = [message.name, ...(typeof details.tool === "string" ? [details.tool] : [])];
  const renames = new Map(
    [...quoted, ...matches].map((name) => [`"${name}"`, `"${safeToolName(name)}"`]),
  );
  const rename = (text: string): string =>
    [...renames].reduce((out, [from, to]) => out.replaceAll(from, to), text);
  return {
    ...shown,
    content: rename(message.content),
    error: {
      ...message.error,
      message: rename(message.error.message),
      ...(message.error.details === undefined
        ? {}
        : {
            details: {
              ...details,
              ...(typeof details.tool === "string" ? { tool: safeToolName(details.tool) } : {}),
              ...(Array.isArray(details.close_matches)
                ? { close_matches: matches.map(safeToolName) }
                : {}),
            },
          }),
    },
  };
}
