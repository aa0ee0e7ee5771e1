const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8", { fatal: true });

/** Encodes a value as UTF-8 JSON bytes for a NATS payload. */
export function encodeJson(value: unknown): Uint8Array {
  return encoder.encode(JSON.stringify(value));
}

/**
 * Decodes UTF-8 JSON bytes. Throws `TypeError` on invalid UTF-8 and `SyntaxError` on
 * invalid JSON; callers turn these into typed errors at their boundary.
 */
export function decodeJson(data: Uint8Array): unknown {
  return JSON.parse(decoder.decode(data));
}
