import { describe, expect, it } from "vitest";
import { Header } from "@toolmesh/protocol";
import { finalHeaders } from "@toolmesh/nats";
import { canonicalDigest } from "./chain.js";
import { endedHeader } from "./ends.js";

describe("endedHeader", () => {
  it("carries the call's end as ASCII JSON a header holds, whatever the names hold", () => {
    const message = {
      role: "tool" as const,
      tool_call_id: "c-1",
      name: "météo.天気",
      session_id: "s\n😀",
      content: "sunny",
      error: { code: "tool_error", message: "no", retryable: false },
      attempts: 2,
    };
    const text = endedHeader(message, "executor@host/1");
    expect(text).toMatch(/^[ -~]+$/);
    expect(JSON.parse(text)).toEqual({
      by: "executor@host/1",
      type: "call.ended",
      call_id: "c-1",
      session: "s\n😀",
      tool: "météo.天気",
      data: {
        outcome: "tool_error",
        result_digest: `sha256:${canonicalDigest("sunny")}`,
        attempts: 2,
      },
    });
    expect(finalHeaders(message, text).get(Header.Ended)).toBe(text);
  });
});
