import { describe, expect, it } from "vitest";
import { retryAfterMs } from "./retry-after.js";

describe("retryAfterMs", () => {
  it("reads the delay of a retryable refusal", () => {
    const error = {
      code: "rate_limited" as const,
      message: "m",
      retryable: true,
      details: { quota: "rate", retry_after_ms: 250 },
    };
    expect(retryAfterMs({ error })).toBe(250);
  });

  it("gives nothing for a success, a final refusal or a missing delay", () => {
    expect(retryAfterMs({})).toBeUndefined();
    const daily = { code: "quota_exceeded" as const, message: "m", retryable: false };
    expect(retryAfterMs({ error: { ...daily, details: { retry_after_ms: 9 } } })).toBeUndefined();
    expect(retryAfterMs({ error: { ...daily, retryable: true } })).toBeUndefined();
    expect(
      retryAfterMs({ error: { ...daily, retryable: true, details: { retry_after_ms: "soon" } } }),
    ).toBeUndefined();
  });
});
