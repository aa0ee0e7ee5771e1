import { ErrorCode, ToolmeshError } from "./errors.js";

const decoder = new TextDecoder("utf-8", { fatal: true });

/**
 * Encodes a value as UTF-8 JSON bytes for a NATS payload. `Buffer.from` rather than
 * `TextEncoder`: several times faster for the small messages of a call's path (it slices a
 * shared pool), and no slower for large ones.
 */
export function encodeJson(value: unknown): Uint8Array {
  return Buffer.from(JSON.stringify(value) ?? "", "utf8");
}

/**
 * The UTF-8 JSON bytes of `value` with one member more, `key`, whose value is given as the
 * UTF-8 bytes of its JSON text (as `encodeJson` wrote them): the bytes
 * `encodeJson({ ...value, [key]: v })` gives, without serializing or encoding a large `v` once
 * more. `value` is a plain object without `key`.
 */
export function encodeJsonWithMember(value: object, key: string, json: Uint8Array): Uint8Array {
  const head = JSON.stringify(value);
  const comma = head === "{}" ? "" : ",";
  return Buffer.concat([
    Buffer.from(`${head.slice(0, -1)}${comma}${JSON.stringify(key)}:`, "utf8"),
    json,
    CLOSE_BRACE,
  ]);
}

const CLOSE_BRACE = Buffer.from("}");

/**
 * `encoded`, the UTF-8 JSON bytes of a plain object without `key` (as `encodeJson` wrote them),
 * with `key` added last: the bytes `encodeJson({ ...object, [key]: value })` gives, without
 * serializing the object again.
 */
export function encodeWithMemberAdded(
  encoded: Uint8Array,
  key: string,
  value: unknown,
): Uint8Array {
  const empty = encoded.length === 2;
  return Buffer.concat([
    encoded.subarray(0, encoded.length - 1),
    Buffer.from(`${empty ? "" : ","}${JSON.stringify(key)}:${JSON.stringify(value)}}`, "utf8"),
  ]);
}

/**
 * Decodes UTF-8 JSON bytes. Throws `TypeError` on invalid UTF-8 and `SyntaxError` on
 * invalid JSON; callers turn these into typed errors at their boundary.
 */
export function decodeJson(data: Uint8Array): unknown {
  return JSON.parse(decoder.decode(data));
}

/** Deepest nesting of objects and arrays accepted in call arguments. */
export const MAX_ARGUMENT_DEPTH = 128;

/**
 * Whether a JSON value nests objects and arrays deeper than `max` levels. Iterative, so it
 * cannot overflow the stack on the very values it guards against.
 */
export function nestsDeeperThan(value: unknown, max: number): boolean {
  const stack: [unknown, number][] = [[value, 0]];
  while (stack.length > 0) {
    const [current, depth] = stack.pop() as [unknown, number];
    if (typeof current !== "object" || current === null) continue;
    if (depth + 1 > max) return true;
    for (const child of Object.values(current)) {
      if (typeof child === "object" && child !== null) stack.push([child, depth + 1]);
    }
  }
  return false;
}

/**
 * The `invalid_request` error of a call whose `context` or `agent_context` nests deeper than
 * {@link MAX_ARGUMENT_DEPTH} levels (`details.field`, `details.max_depth`), or undefined when
 * neither does. Checked where a call enters (client, resolver): such values would overflow the
 * stack of every later `JSON.stringify` on their way.
 */
export function contextDepthError(request: {
  context?: unknown;
  agent_context?: unknown;
}): ToolmeshError | undefined {
  for (const field of ["context", "agent_context"] as const) {
    if (!nestsDeeperThan(request[field], MAX_ARGUMENT_DEPTH)) continue;
    return new ToolmeshError(
      ErrorCode.InvalidRequest,
      `${field} nests deeper than ${MAX_ARGUMENT_DEPTH} levels`,
      { details: { field, max_depth: MAX_ARGUMENT_DEPTH } },
    );
  }
  return undefined;
}

/** Decodes UTF-8 JSON bytes, or gives undefined when they are not (for foreign messages). */
export function decodeJsonOrUndefined(data: Uint8Array): unknown {
  try {
    return decodeJson(data);
  } catch {
    return undefined;
  }
}
