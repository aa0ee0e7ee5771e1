import { describe, expect, it } from "vitest";
import { MAX_PAYLOAD_CHARS, redactPayload } from "./payloads.js";

describe("redactPayload", () => {
  it("replaces secret-looking keys at any depth and keeps the rest", () => {
    const text = redactPayload({
      city: "Paris",
      api_key: "sk-1",
      nested: { Authorization: "Bearer x", list: [{ password: "p", ok: 1 }] },
    });
    expect(JSON.parse(text)).toEqual({
      city: "Paris",
      api_key: "[redacted]",
      nested: { Authorization: "[redacted]", list: [{ password: "[redacted]", ok: 1 }] },
    });
  });

  it("redacts a string result that holds JSON, and keeps plain text", () => {
    expect(JSON.parse(redactPayload('{"token":"t","n":2}'))).toEqual({
      token: "[redacted]",
      n: 2,
    });
    expect(redactPayload("sunny, 21 °C")).toBe("sunny, 21 °C");
  });

  it("cuts long payloads", () => {
    const text = redactPayload("x".repeat(MAX_PAYLOAD_CHARS + 10));
    expect(text).toHaveLength(MAX_PAYLOAD_CHARS + 1);
    expect(text.endsWith("…")).toBe(true);
  });

  it("never throws on values without a JSON form", () => {
    const cyclic: Record<string, unknown> = {};
    cyclic.self = cyclic;
    expect(redactPayload(cyclic)).toBe("");
  });
});
