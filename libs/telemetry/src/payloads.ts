import { REDACTED } from "./logger.js";

const KEY = Symbol.for("@toolmesh/telemetry.payloads");
const state = globalThis as { [KEY]?: boolean };

/** Longest payload copied into a span attribute, in characters. */
export const MAX_PAYLOAD_CHARS = 4_096;

// Keys whose values are credentials wherever they appear, as in the logger's redact paths.
const SECRET_KEY = /pass(word)?|token|secret|api[-_]?key|authori[sz]ation|credential|cookie/i;

/**
 * Turns recording of tool arguments and results on span attributes on or off for the process
 * (`TOOLMESH_TRACE_PAYLOADS`). Off by default: arguments and results are the users' data.
 */
export function setPayloadRecording(on: boolean): void {
  state[KEY] = on;
}

/** Whether tool arguments and results are recorded on spans. */
export function payloadRecording(): boolean {
  return state[KEY] === true;
}

/**
 * A payload as a span attribute: JSON with the values of secret-looking keys (password, token,
 * secret, api key, authorization, credential, cookie) replaced by `[redacted]` at any depth, cut
 * to {@link MAX_PAYLOAD_CHARS}. Never throws.
 */
export function redactPayload(value: unknown): string {
  let text: string;
  try {
    text =
      typeof value === "string"
        ? redactJsonText(value)
        : (JSON.stringify(value, (key, v: unknown) =>
            key !== "" && SECRET_KEY.test(key) ? REDACTED : v,
          ) ?? "");
  } catch {
    text = "";
  }
  return text.length > MAX_PAYLOAD_CHARS ? `${text.slice(0, MAX_PAYLOAD_CHARS)}…` : text;
}

// A string result may itself be JSON holding secrets; other text is kept as it is.
function redactJsonText(text: string): string {
  const trimmed = text.trimStart();
  if (!trimmed.startsWith("{") && !trimmed.startsWith("[")) return text;
  try {
    return redactPayload(JSON.parse(text) as unknown);
  } catch {
    return text;
  }
}
