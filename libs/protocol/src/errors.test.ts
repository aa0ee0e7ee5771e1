import { describe, expect, it } from "vitest";
import {
  ErrorCode,
  RetryableError,
  TerminalError,
  ToolmeshError,
  WireErrorSchema,
  ensureError,
  isRetryableByDefault,
} from "./errors.js";
import type { WireError } from "./errors.js";
import { Defaults } from "./defaults.js";
import { CallRequestSchema, MAX_ID_LENGTH, MAX_TOOL_NAME_LENGTH } from "./envelopes.js";
import { ToolDefinitionSchema, summarize } from "./tool-definition.js";

const RETRYABLE_CODES = new Set<string>([
  "timeout",
  "unavailable",
  "overloaded",
  "rate_limited",
  "idempotency_in_flight",
  "internal",
]);

/** Matches a lone (unpaired) UTF-16 surrogate. */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

describe("ToolmeshError", () => {
  it.each(Object.values(ErrorCode))("has the documented default retry verdict for %s", (code) => {
    const err = new ToolmeshError(code, "m");
    expect(err.retryable).toBe(RETRYABLE_CODES.has(code));
    expect(isRetryableByDefault(code)).toBe(RETRYABLE_CODES.has(code));
  });

  it("lets the thrower override the default verdict either way", () => {
    expect(new ToolmeshError(ErrorCode.Timeout, "m", { retryable: false }).retryable).toBe(false);
    expect(new ToolmeshError(ErrorCode.InvalidRequest, "m", { retryable: true }).retryable).toBe(
      true,
    );
  });

  it("is an Error with its name, code, message, details and cause", () => {
    const cause = new Error("root");
    const err = new ToolmeshError(ErrorCode.Unavailable, "down", {
      details: { backend: "db" },
      cause,
    });
    expect(err).toBeInstanceOf(Error);
    expect(err.name).toBe("ToolmeshError");
    expect(err.code).toBe("unavailable");
    expect(err.message).toBe("down");
    expect(err.details).toEqual({ backend: "db" });
    expect(err.cause).toBe(cause);
    expect(new ToolmeshError(ErrorCode.Internal, "x")).not.toHaveProperty("cause");
  });

  it("sends code, message, verdict and details on the wire, never cause or stack", () => {
    const err = new ToolmeshError(ErrorCode.ToolError, "boom", {
      details: { attempt: 2 },
      cause: new Error("secret internals"),
    });
    const wire = err.toWire();
    expect(wire).toEqual({
      code: "tool_error",
      message: "boom",
      retryable: false,
      details: { attempt: 2 },
    });
    expect(Object.keys(wire).sort()).toEqual(["code", "details", "message", "retryable"]);
    const text = JSON.stringify(wire);
    expect(text).not.toContain("secret internals");
    expect(text).not.toContain("stack");
    expect(WireErrorSchema.parse(wire)).toEqual(wire);
  });

  it("omits details from the wire when there are none", () => {
    const wire = new ToolmeshError(ErrorCode.Timeout, "slow").toWire();
    expect("details" in wire).toBe(false);
    expect(JSON.stringify(wire)).toBe('{"code":"timeout","message":"slow","retryable":true}');
  });

  it.each<WireError>([
    {
      code: "unknown_tool",
      message: "no such tool",
      retryable: false,
      details: { close_matches: ["a"] },
    },
    { code: "internal", message: "bug", retryable: false },
    { code: "invalid_arguments", message: "bad json", retryable: true },
    { code: "overloaded", message: "", retryable: true, details: {} },
  ])("rebuilds an error from its wire form: $code", (wire) => {
    const err = ToolmeshError.fromWire(wire);
    expect(err).toBeInstanceOf(ToolmeshError);
    expect(err.code).toBe(wire.code);
    expect(err.message).toBe(wire.message);
    expect(err.retryable).toBe(wire.retryable);
    expect(err.toWire()).toEqual(wire);
    expect("details" in err.toWire()).toBe("details" in wire);
  });
});

describe("RetryableError and TerminalError", () => {
  it("RetryableError is a retryable tool_error with an optional minimum delay", () => {
    const err = new RetryableError("rate limited", { retryAfterMs: 2_500, details: { n: 1 } });
    expect(err).toBeInstanceOf(ToolmeshError);
    expect(err.code).toBe("tool_error");
    expect(err.retryable).toBe(true);
    expect(err.retryAfterMs).toBe(2_500);
    expect(err.details).toEqual({ n: 1 });
    expect(new RetryableError("x").retryAfterMs).toBeUndefined();
    expect(err.toWire()).toEqual({
      code: "tool_error",
      message: "rate limited",
      retryable: true,
      details: { n: 1 },
    });
  });

  it("TerminalError is a tool_error that is never retried", () => {
    const cause = new Error("root");
    const err = new TerminalError("bad input", { cause });
    expect(err).toBeInstanceOf(ToolmeshError);
    expect(err.code).toBe("tool_error");
    expect(err.retryable).toBe(false);
    expect(err.cause).toBe(cause);
    expect(err.toWire()).toEqual({ code: "tool_error", message: "bad input", retryable: false });
  });
});

describe("ensureError", () => {
  it("passes typed errors through unchanged", () => {
    for (const err of [
      new ToolmeshError(ErrorCode.Cancelled, "c"),
      new RetryableError("r", { retryAfterMs: 5 }),
      new TerminalError("t"),
    ]) {
      expect(ensureError(err)).toBe(err);
      expect(ensureError(err, ErrorCode.ToolError)).toBe(err);
    }
  });

  it("wraps an Error as internal by default, keeping its message and the cause", () => {
    const original = new TypeError("x is not a function");
    const err = ensureError(original);
    expect(err).toBeInstanceOf(ToolmeshError);
    expect(err.code).toBe("internal");
    expect(err.retryable).toBe(true);
    expect(err.message).toBe("x is not a function");
    expect(err.cause).toBe(original);
    expect(JSON.stringify(err.toWire())).not.toContain("TypeError:");
  });

  it("uses the fallback code and its verdict", () => {
    const err = ensureError(new Error("nope"), ErrorCode.InvalidRequest);
    expect(err.code).toBe("invalid_request");
    expect(err.retryable).toBe(false);
  });

  it("gives an Error without a message its name as message", () => {
    expect(ensureError(new RangeError()).message).toBe("RangeError");
  });

  it("keeps a thrown string as the message", () => {
    const err = ensureError("disk full");
    expect(err.code).toBe("internal");
    expect(err.message).toBe("disk full");
    expect(err.cause).toBe("disk full");
  });

  it.each([
    ["an object", { reason: "x" }, "[object Object]"],
    ["undefined", undefined, "undefined"],
    ["null", null, "null"],
    ["a number", 42, "42"],
  ])("turns %s into a typed error without throwing", (_label, thrown, shown) => {
    const err = ensureError(thrown);
    expect(err).toBeInstanceOf(ToolmeshError);
    expect(err.code).toBe("internal");
    expect(typeof err.message).toBe("string");
    expect(err.message).toContain(shown);
    expect(err.cause).toBe(thrown);
    expect(WireErrorSchema.safeParse(err.toWire()).success).toBe(true);
  });
});

describe("CallRequestSchema", () => {
  const base = { session_id: "s1" };

  it("accepts the OpenAI shape with string arguments", () => {
    const parsed = CallRequestSchema.parse({
      ...base,
      tool_call: {
        id: "call_1",
        type: "function",
        function: { name: "get_weather", arguments: '{"city":"Paris"}' },
      },
    });
    expect(parsed.tool_call.function.arguments).toBe('{"city":"Paris"}');
    expect(parsed.tool_call.type).toBe("function");
  });

  it("accepts object arguments and defaults the type", () => {
    const parsed = CallRequestSchema.parse({
      ...base,
      tool_call: { id: "c", function: { name: "t", arguments: { city: "Paris", n: [1] } } },
    });
    expect(parsed.tool_call.type).toBe("function");
    expect(parsed.tool_call.function.arguments).toEqual({ city: "Paris", n: [1] });
  });

  it.each([
    ["an array", [1, 2]],
    ["an empty array", []],
    ["null", null],
    ["a number", 3],
    ["a boolean", true],
    ["absent", undefined],
  ])("rejects arguments that are %s", (_label, args) => {
    const result = CallRequestSchema.safeParse({
      ...base,
      tool_call: { id: "c", function: { name: "t", arguments: args } },
    });
    expect(result.success).toBe(false);
  });

  it("rejects a type other than function", () => {
    const result = CallRequestSchema.safeParse({
      ...base,
      tool_call: { id: "c", type: "code_interpreter", function: { name: "t", arguments: "{}" } },
    });
    expect(result.success).toBe(false);
  });

  it("bounds ids to MAX_ID_LENGTH and rejects empty ones", () => {
    const call = (id: string, session: string, key?: string) =>
      CallRequestSchema.safeParse({
        session_id: session,
        ...(key === undefined ? {} : { idempotency_key: key }),
        tool_call: { id, function: { name: "t", arguments: "{}" } },
      }).success;
    const max = "i".repeat(MAX_ID_LENGTH);
    const over = "i".repeat(MAX_ID_LENGTH + 1);
    expect(call(max, max, max)).toBe(true);
    expect(call(over, "s")).toBe(false);
    expect(call("c", over)).toBe(false);
    expect(call("c", "s", over)).toBe(false);
    expect(call("", "s")).toBe(false);
    expect(call("c", "")).toBe(false);
  });

  it("rejects a timeout that is not a positive integer of ms", () => {
    for (const timeout_ms of [0, -1, 1.5, "100"]) {
      const result = CallRequestSchema.safeParse({
        ...base,
        timeout_ms,
        tool_call: { id: "c", function: { name: "t", arguments: "{}" } },
      });
      expect(result.success, String(timeout_ms)).toBe(false);
    }
  });
});

describe("ToolDefinitionSchema", () => {
  const minimal = {
    name: "t",
    summary: "s",
    parameters: { type: "object" },
    kind: "builtin",
    owner: "o",
  };

  it("applies the documented defaults", () => {
    const def = ToolDefinitionSchema.parse(minimal);
    expect(def.description).toBe("");
    expect(def.groups).toEqual(["default"]);
    expect(def.system_params).toEqual(["executor", "storage"]);
    expect(def.system_params).toEqual([...Defaults.systemParams]);
    expect(def.preset_params).toEqual([]);
    expect(def.timeout_ms).toBe(Defaults.toolTimeoutMs);
    expect(def.timeout_ms).toBe(30_000);
    expect(def.retry).toEqual({
      max_attempts: 3,
      initial_backoff_ms: 1_000,
      backoff_multiplier: 2,
      max_backoff_ms: 30_000,
      non_retryable_codes: [],
    });
  });

  it("fills the rest of a partial retry policy", () => {
    const def = ToolDefinitionSchema.parse({ ...minimal, retry: { max_attempts: 5 } });
    expect(def.retry.max_attempts).toBe(5);
    expect(def.retry.initial_backoff_ms).toBe(1_000);
    expect(def.retry.non_retryable_codes).toEqual([]);
  });

  it("gives every definition its own default arrays", () => {
    const a = ToolDefinitionSchema.parse(minimal);
    const b = ToolDefinitionSchema.parse(minimal);
    a.groups.push("x");
    a.system_params.push("x");
    a.retry.non_retryable_codes.push("timeout");
    expect(b.groups).toEqual(["default"]);
    expect(b.system_params).toEqual(["executor", "storage"]);
    expect(b.retry.non_retryable_codes).toEqual([]);
    expect(Defaults.systemParams).toEqual(["executor", "storage"]);
  });

  it("rejects bad names, groups, timeouts and retry codes", () => {
    const bad = [
      { ...minimal, name: "" },
      { ...minimal, name: "n".repeat(MAX_TOOL_NAME_LENGTH + 1) },
      { ...minimal, groups: [""] },
      { ...minimal, timeout_ms: 0 },
      { ...minimal, kind: "python" },
      { ...minimal, owner: "" },
      { ...minimal, retry: { max_attempts: 0 } },
      { ...minimal, retry: { non_retryable_codes: ["nope"] } },
    ];
    for (const input of bad) {
      expect(
        ToolDefinitionSchema.safeParse(input).success,
        JSON.stringify(input).slice(0, 80),
      ).toBe(false);
    }
    expect(
      ToolDefinitionSchema.safeParse({ ...minimal, name: "n".repeat(MAX_TOOL_NAME_LENGTH) })
        .success,
    ).toBe(true);
  });
});

describe("summarize", () => {
  it("keeps the first sentence", () => {
    expect(summarize("Adds two numbers. Returns their sum.")).toBe("Adds two numbers.");
    expect(summarize("Is it raining? Ask this tool.")).toBe("Is it raining?");
    expect(summarize("Deletes everything! Careful.")).toBe("Deletes everything!");
  });

  it("does not end a sentence inside a number or a dotted name", () => {
    expect(summarize("Uses API v1.2 to read fs.stat results. More.")).toBe(
      "Uses API v1.2 to read fs.stat results.",
    );
  });

  it("keeps a description without a sentence end whole", () => {
    expect(summarize("Fetches a web page")).toBe("Fetches a web page");
  });

  it("uses only the first non-blank line of a multi-line description", () => {
    expect(summarize("Fetches a page\nThen parses it. Really.")).toBe("Fetches a page");
    expect(summarize("\n\n  Reads a file.\r\nSecond line.")).toBe("Reads a file.");
    expect(summarize("First line.\r\nSecond line.")).toBe("First line.");
  });

  it("gives an empty summary for an empty or blank description", () => {
    expect(summarize("")).toBe("");
    expect(summarize("   \n  ")).toBe("");
  });

  it("bounds the length with an ellipsis", () => {
    const exact = "a".repeat(120);
    expect(summarize(exact)).toBe(exact);
    const long = "b".repeat(300) + ". Next.";
    const out = summarize(long);
    expect(out).toHaveLength(120);
    expect(out.endsWith("…")).toBe(true);
    expect(summarize("a".repeat(121))).toBe(`${"a".repeat(119)}…`);
  });

  it("honours a custom bound and trims the space before the ellipsis", () => {
    expect(summarize("aaaa bbbb cccc", 6)).toBe("aaaa…");
    expect(summarize("aaaa bbbb cccc", 6).length).toBeLessThanOrEqual(6);
    expect(summarize("short.", 6)).toBe("short.");
  });

  it("does not cut a character in half at the bound", () => {
    const out = summarize("a".repeat(118) + "😀😀😀😀");
    expect(out.length).toBeLessThanOrEqual(120);
    expect(out.endsWith("…")).toBe(true);
    expect(LONE_SURROGATE.test(out), JSON.stringify(out.slice(-4))).toBe(false);
  });
});
