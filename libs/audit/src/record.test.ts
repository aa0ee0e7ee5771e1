import { describe, expect, it } from "vitest";
import { callEnded, recordedArguments } from "./record.js";

describe("recordedArguments", () => {
  const args = { query: "q", card: { number: "4111", exp: "12/30" }, "a/b": "slash", list: [1, 2] };

  it("records nothing but the digest by default, everything in full", () => {
    expect(recordedArguments(args, { kind: "digest" })).toEqual({});
    expect(recordedArguments(args, { kind: "full" })).toEqual({ arguments: args });
  });

  it("redacts the value at each pointer, skips pointers that name nothing, leaves the input", () => {
    const out = recordedArguments(args, {
      kind: "redacted",
      pointers: ["/card/number", "/a~1b", "/list/1", "/missing/deep", "/query/x"],
    });
    expect(out).toEqual({
      arguments: {
        query: "q",
        card: { number: "[redacted]", exp: "12/30" },
        "a/b": "[redacted]",
        list: [1, "[redacted]"],
      },
    });
    expect(args.card.number).toBe("4111");
  });
});

describe("callEnded", () => {
  it("records the outcome, a digest of the content, and the attempts and duration it says", () => {
    const event = callEnded(
      {
        role: "tool",
        tool_call_id: "c1",
        name: "echo",
        session_id: "s",
        content: "secret result",
        attempts: 2,
        duration_ms: 12.5,
      },
      1,
    );
    expect(event).toMatchObject({ type: "call.ended", call_id: "c1", at: 1 });
    expect(event.data).toEqual({
      outcome: "ok",
      result_digest: expect.stringMatching(/^sha256:[0-9a-f]{64}$/) as unknown,
      attempts: 2,
      duration_ms: 12.5,
    });
    expect(JSON.stringify(event)).not.toContain("secret result");
  });
});
