import { describe, expect, it } from "vitest";
import { decodePolicy, decodeSchemas, decodeTenantGroups } from "./state.js";

const bytes = (value: unknown): Uint8Array => new TextEncoder().encode(JSON.stringify(value));
const raw = (text: string): Uint8Array => new TextEncoder().encode(text);

describe("state decoding", () => {
  it("reads expansion state into maps", () => {
    const state = decodeSchemas(
      bytes({
        session_id: "s",
        requested_tools: ["a", 3, "b"],
        expanded_tools: { a: 4, b: "x", c: 1.5 },
        updated_at: 10,
      }),
    );
    expect(state).toEqual({
      session_id: "s",
      requested_tools: ["a", "b"],
      expanded_tools: new Map([["a", 4]]),
      updated_at: 10,
    });
  });

  it("keeps a tool named __proto__ as an ordinary key", () => {
    const state = decodeSchemas(raw('{"session_id":"s","expanded_tools":{"__proto__":2}}'));
    expect(state?.expanded_tools.get("__proto__")).toBe(2);
    expect(Object.prototype).not.toHaveProperty("2");
  });

  it("reads policies and tenant switches, dropping values of the wrong type", () => {
    expect(
      decodePolicy(bytes({ session_id: "s", agent: "a", groups: { web: false, x: 1 } })),
    ).toEqual({
      session_id: "s",
      agent: "a",
      groups: new Map([["web", false]]),
      updated_at: 0,
    });
    expect(decodeTenantGroups(bytes({ groups: { admin: false } }))?.groups).toEqual(
      new Map([["admin", false]]),
    );
  });

  it("gives undefined for anything that is not state", () => {
    expect(decodeSchemas(raw("not json"))).toBeUndefined();
    expect(decodeSchemas(bytes([1, 2]))).toBeUndefined();
    expect(decodePolicy(bytes({ agent: "a" }))).toBeUndefined();
    expect(decodeTenantGroups(bytes(null))).toBeUndefined();
  });
});
