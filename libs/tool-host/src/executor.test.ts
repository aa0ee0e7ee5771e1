import { describe, expect, it } from "vitest";
import {
  ErrorCode,
  RetryPolicySchema,
  RetryableError,
  TerminalError,
  ToolmeshError,
  WireErrorSchema,
} from "@toolmesh/protocol";
import type { ToolDefinition } from "@toolmesh/protocol";
import { toolDefinitionOf } from "./executor.js";
import { handlerError, retryDelay, toContent } from "./handle-work.js";
import type { ToolModule } from "./tool-module.js";

/** A definition with a retry policy: the defaults overridden by `policy`. */
function withRetry(
  policy: Parameters<typeof RetryPolicySchema.parse>[0],
): Pick<ToolDefinition, "retry"> {
  return { retry: RetryPolicySchema.parse(policy) };
}

const FAR = 1e12;
const retryable = (): ToolmeshError => new ToolmeshError(ErrorCode.Unavailable, "down");

function thrownBy(fn: () => unknown): unknown {
  try {
    fn();
  } catch (err) {
    return err;
  }
  throw new Error("expected a throw");
}

describe("retryDelay", () => {
  const policy = withRetry({
    max_attempts: 10,
    initial_backoff_ms: 100,
    backoff_multiplier: 2,
    max_backoff_ms: 1_000,
  });

  it("grows exponentially from the initial backoff", () => {
    const delays = [1, 2, 3, 4].map((attempt) => retryDelay(retryable(), attempt, policy, FAR, 0));
    expect(delays).toEqual([100, 200, 400, 800]);
  });

  it("is capped at max_backoff_ms", () => {
    expect(retryDelay(retryable(), 5, policy, FAR, 0)).toBe(1_000);
    expect(retryDelay(retryable(), 9, policy, FAR, 0)).toBe(1_000);
  });

  it("rounds fractional delays to whole ms", () => {
    const p = withRetry({ max_attempts: 10, initial_backoff_ms: 100, backoff_multiplier: 1.5 });
    expect(retryDelay(retryable(), 4, p, FAR, 0)).toBe(338); // 337.5
  });

  it("uses the default policy when the tool sets none", () => {
    const p = withRetry({});
    expect(retryDelay(retryable(), 1, p, FAR, 0)).toBe(1_000);
    expect(retryDelay(retryable(), 2, p, FAR, 0)).toBe(2_000);
    expect(retryDelay(retryable(), 3, p, FAR, 0)).toBeUndefined();
  });

  it("waits at least RetryableError.retryAfterMs, even beyond the cap", () => {
    expect(
      retryDelay(new RetryableError("slow down", { retryAfterMs: 5_000 }), 1, policy, FAR, 0),
    ).toBe(5_000);
    expect(
      retryDelay(new RetryableError("slow down", { retryAfterMs: 150 }), 1, policy, FAR, 0),
    ).toBe(150);
    // A smaller hint never shortens the backoff.
    expect(
      retryDelay(new RetryableError("slow down", { retryAfterMs: 10 }), 3, policy, FAR, 0),
    ).toBe(400);
    expect(retryDelay(new RetryableError("again"), 2, policy, FAR, 0)).toBe(200);
  });

  it("gives up on errors that are not retryable", () => {
    expect(retryDelay(new TerminalError("bad"), 1, policy, FAR, 0)).toBeUndefined();
    expect(
      retryDelay(new ToolmeshError(ErrorCode.InvalidParameters, "x"), 1, policy, FAR, 0),
    ).toBeUndefined();
    expect(
      retryDelay(
        new ToolmeshError(ErrorCode.Timeout, "x", { retryable: false }),
        1,
        policy,
        FAR,
        0,
      ),
    ).toBeUndefined();
  });

  it("gives up on codes the policy lists as non-retryable, and only those", () => {
    const p = withRetry({ max_attempts: 5, non_retryable_codes: ["unavailable"] });
    expect(retryDelay(retryable(), 1, p, FAR, 0)).toBeUndefined();
    expect(retryDelay(new ToolmeshError(ErrorCode.Timeout, "slow"), 1, p, FAR, 0)).toBe(1_000);
    const q = withRetry({ max_attempts: 5, non_retryable_codes: ["tool_error"] });
    expect(retryDelay(new RetryableError("r", { retryAfterMs: 1 }), 1, q, FAR, 0)).toBeUndefined();
  });

  it("gives up when the attempts are used up", () => {
    const p = withRetry({ max_attempts: 3, initial_backoff_ms: 10 });
    expect(retryDelay(retryable(), 1, p, FAR, 0)).toBe(10);
    expect(retryDelay(retryable(), 2, p, FAR, 0)).toBe(20);
    expect(retryDelay(retryable(), 3, p, FAR, 0)).toBeUndefined();
    expect(retryDelay(retryable(), 7, p, FAR, 0)).toBeUndefined();
    expect(retryDelay(retryable(), 1, withRetry({ max_attempts: 1 }), FAR, 0)).toBeUndefined();
  });

  it("gives up when the next attempt would start at or past the deadline", () => {
    // attempt 1: delay 100.
    expect(retryDelay(retryable(), 1, policy, 10_101, 10_000)).toBe(100);
    expect(retryDelay(retryable(), 1, policy, 10_100, 10_000)).toBeUndefined();
    expect(retryDelay(retryable(), 1, policy, 10_050, 10_000)).toBeUndefined();
    expect(retryDelay(retryable(), 1, policy, 9_000, 10_000)).toBeUndefined();
    // The handler's hint counts too.
    expect(
      retryDelay(new RetryableError("r", { retryAfterMs: 60_000 }), 1, policy, 40_000, 10_000),
    ).toBeUndefined();
  });

  it("reads the clock when no time is given", () => {
    expect(retryDelay(retryable(), 1, policy, Date.now() + 60_000)).toBe(100);
    expect(retryDelay(retryable(), 1, policy, Date.now() + 50)).toBeUndefined();
  });

  it("never retries deadline_exceeded, even when marked retryable", () => {
    const err = new ToolmeshError(ErrorCode.DeadlineExceeded, "late", { retryable: true });
    expect(err.retryable).toBe(true);
    expect(retryDelay(err, 1, policy, FAR, 0)).toBeUndefined();
  });
});

describe("toContent", () => {
  it("keeps strings as they are", () => {
    expect(toContent("hello")).toBe("hello");
    expect(toContent("")).toBe("");
    expect(toContent('{"a":1}')).toBe('{"a":1}');
  });

  it("turns nothing into an empty string", () => {
    expect(toContent(undefined)).toBe("");
    expect(toContent(null)).toBe("");
  });

  it("turns other values into JSON", () => {
    expect(toContent({ a: 1, b: [true, null] })).toBe('{"a":1,"b":[true,null]}');
    expect(toContent([1, "x"])).toBe('[1,"x"]');
    expect(toContent(42)).toBe("42");
    expect(toContent(0)).toBe("0");
    expect(toContent(false)).toBe("false");
    expect(toContent({ toJSON: () => "custom" })).toBe('"custom"');
  });

  it.each([
    ["a BigInt", 10n],
    ["an object holding a BigInt", { n: 1n }],
  ])("refuses %s with a non-retryable tool_error", (_label, value) => {
    const err = thrownBy(() => toContent(value));
    expect(err).toBeInstanceOf(ToolmeshError);
    expect((err as ToolmeshError).code).toBe("tool_error");
    expect((err as ToolmeshError).retryable).toBe(false);
    expect((err as ToolmeshError).cause).toBeInstanceOf(TypeError);
  });

  it("refuses a circular result with a non-retryable tool_error", () => {
    const circular: Record<string, unknown> = {};
    circular.self = circular;
    const err = thrownBy(() => toContent(circular));
    expect(err).toBeInstanceOf(ToolmeshError);
    expect((err as ToolmeshError).code).toBe("tool_error");
    expect((err as ToolmeshError).retryable).toBe(false);
  });

  it.each([
    ["a function", () => 1],
    ["a symbol", Symbol("s")],
    ["an object whose toJSON gives undefined", { toJSON: () => undefined }],
  ])("gives a string (or a tool_error) for %s, never undefined", (_label, value) => {
    let out: unknown;
    try {
      out = toContent(value);
    } catch (err) {
      expect(err).toBeInstanceOf(ToolmeshError);
      expect((err as ToolmeshError).code).toBe("tool_error");
      return;
    }
    expect(typeof out).toBe("string");
  });
});

describe("handlerError", () => {
  it("passes typed errors through", () => {
    for (const err of [
      new ToolmeshError(ErrorCode.PermissionDenied, "no"),
      new TerminalError("t"),
      new RetryableError("r", { retryAfterMs: 5 }),
    ]) {
      expect(handlerError(err)).toBe(err);
    }
  });

  it("makes a plain Error a retryable tool_error", () => {
    const original = new TypeError("cannot read x");
    const err = handlerError(original);
    expect(err.code).toBe("tool_error");
    expect(err.retryable).toBe(true);
    expect(err.message).toBe("cannot read x");
    expect(err.cause).toBe(original);
    expect(err.details).toBeUndefined();
  });

  it("honours a thrown Error's own retryable:false", () => {
    const err = handlerError(Object.assign(new Error("quota exhausted"), { retryable: false }));
    expect(err.code).toBe("tool_error");
    expect(err.retryable).toBe(false);
    expect(err.message).toBe("quota exhausted");
  });

  it("ignores a retryable that is not a boolean", () => {
    expect(handlerError(Object.assign(new Error("x"), { retryable: "false" })).retryable).toBe(
      true,
    );
    expect(handlerError(Object.assign(new Error("x"), { retryable: 0 })).retryable).toBe(true);
  });

  it("honours a plain thrown object's retryable and message", () => {
    const err = handlerError({ message: "quota exhausted", retryable: false });
    expect(err.code).toBe("tool_error");
    expect(err.retryable).toBe(false);
    expect(err.message).toBe("quota exhausted");
  });

  it("honours a wire code and details", () => {
    const err = handlerError(
      Object.assign(new Error("backend down"), { code: "unavailable", details: { backend: "db" } }),
    );
    expect(err.code).toBe("unavailable");
    expect(err.details).toEqual({ backend: "db" });
    expect(err.message).toBe("backend down");
    expect(err.toWire()).toEqual({
      code: "unavailable",
      message: "backend down",
      retryable: true,
      details: { backend: "db" },
    });
  });

  it("honours code and retryable together", () => {
    const err = handlerError(
      Object.assign(new Error("no"), { code: "permission_denied", retryable: false }),
    );
    expect(err.code).toBe("permission_denied");
    expect(err.retryable).toBe(false);
  });

  it.each([
    ["an unknown code", "not_a_code"],
    ["a Node system error code", "ECONNREFUSED"],
    ["a code of another case", "UNAVAILABLE"],
    ["a numeric code", 503],
  ])("maps %s to tool_error", (_label, code) => {
    const err = handlerError(Object.assign(new Error("x"), { code }));
    expect(err.code).toBe("tool_error");
    expect(err.retryable).toBe(true);
  });

  it("drops details that are not an object", () => {
    expect(
      handlerError(Object.assign(new Error("x"), { details: "text" })).details,
    ).toBeUndefined();
    expect(handlerError(Object.assign(new Error("x"), { details: null })).details).toBeUndefined();
    expect(handlerError(Object.assign(new Error("x"), { details: 7 })).details).toBeUndefined();
  });

  it.each([
    ["an object", { ok: 1 }],
    ["a Map", new Map([["k", 1]])],
    ["an array", ["a", "b"]],
  ])("gives an error that is still valid after the wire when details are %s", (_label, details) => {
    const wire = handlerError(
      Object.assign(new Error("x"), { code: "unavailable", details }),
    ).toWire();
    const received: unknown = JSON.parse(JSON.stringify(wire));
    expect(WireErrorSchema.safeParse(received).success, JSON.stringify(wire)).toBe(true);
  });

  it("keeps a thrown string as the message", () => {
    const err = handlerError("disk full");
    expect(err.code).toBe("tool_error");
    expect(err.retryable).toBe(true);
    expect(err.message).toBe("disk full");
    expect(err.cause).toBe("disk full");
    expect(err.toWire()).toEqual({ code: "tool_error", message: "disk full", retryable: true });
  });

  it.each([
    ["undefined", undefined],
    ["null", null],
    ["a number", 42],
  ])("turns a thrown %s into a tool_error without throwing", (_label, thrown) => {
    const err = handlerError(thrown);
    expect(err).toBeInstanceOf(ToolmeshError);
    expect(err.code).toBe("tool_error");
    expect(err.message).toBe(String(thrown));
  });
});

describe("toolDefinitionOf", () => {
  const parameters = {
    type: "object",
    properties: {
      query: { type: "string", description: "what to look for" },
      api_key: { type: "string" },
      region: { type: "string", default: "eu" },
      limit: { type: "integer", default: 10 },
    },
    required: ["query", "api_key"],
    additionalProperties: false,
  };

  const search: ToolModule = {
    name: "web.search",
    description: "Searches the web. Returns the top hits as JSON.",
    parameters,
    presets: { api_key: "sk-SECRET-VALUE", region: "us" },
    handler: () => "ok",
  };

  it("removes preset params from properties and required, and lists their names", () => {
    const def = toolDefinitionOf(search, "exec-1");
    expect(def.parameters).toEqual({
      type: "object",
      properties: {
        query: { type: "string", description: "what to look for" },
        limit: { type: "integer", default: 10 },
      },
      required: ["query"],
      additionalProperties: false,
    });
    expect(def.preset_params).toEqual(["api_key", "region"]);
  });

  it("never puts preset values into the definition", () => {
    expect(JSON.stringify(toolDefinitionOf(search, "exec-1"))).not.toContain("sk-SECRET-VALUE");
  });

  it("leaves the module's own schema untouched", () => {
    const before = structuredClone(parameters);
    toolDefinitionOf(search, "exec-1");
    expect(search.parameters).toEqual(before);
  });

  it("adds no required list when the schema had none", () => {
    const def = toolDefinitionOf(
      {
        ...search,
        parameters: { type: "object", properties: { q: { type: "string" }, api_key: {} } },
      },
      "o",
    );
    expect(def.parameters).toEqual({ type: "object", properties: { q: { type: "string" } } });
    expect("required" in def.parameters).toBe(false);
  });

  it("keeps the schema as it is when there are no presets", () => {
    const def = toolDefinitionOf({ ...search, presets: undefined }, "o");
    expect(def.parameters).toEqual(parameters);
    expect(def.preset_params).toEqual([]);
  });

  it("derives the summary from the description unless one is given", () => {
    expect(toolDefinitionOf(search, "o").summary).toBe("Searches the web.");
    expect(toolDefinitionOf({ ...search, summary: "Web search" }, "o").summary).toBe("Web search");
    expect(toolDefinitionOf({ ...search, description: "" }, "o").summary).toBe("");
  });

  it("carries name, description, owner, kind, groups, timeout and retry", () => {
    const def = toolDefinitionOf(
      {
        ...search,
        groups: ["search", "web"],
        timeoutMs: 5_000,
        retry: { max_attempts: 5, non_retryable_codes: ["invalid_parameters"] },
        systemParams: ["executor"],
      },
      "exec-7",
    );
    expect(def.name).toBe("web.search");
    expect(def.description).toBe(search.description);
    expect(def.owner).toBe("exec-7");
    expect(def.kind).toBe("builtin");
    expect(def.groups).toEqual(["search", "web"]);
    expect(def.timeout_ms).toBe(5_000);
    expect(def.retry).toEqual({
      max_attempts: 5,
      initial_backoff_ms: 1_000,
      backoff_multiplier: 2,
      max_backoff_ms: 30_000,
      non_retryable_codes: ["invalid_parameters"],
    });
    expect(def.system_params).toEqual(["executor"]);
  });

  it("applies the registry defaults for what the module leaves out", () => {
    const def = toolDefinitionOf(
      { name: "t", description: "d", parameters: { type: "object" }, handler: () => 1 },
      "o",
    );
    expect(def.groups).toEqual(["default"]);
    expect(def.system_params).toEqual(["executor", "storage"]);
    expect(def.timeout_ms).toBe(30_000);
    expect(def.retry.max_attempts).toBe(3);
    expect(def.preset_params).toEqual([]);
  });
});
