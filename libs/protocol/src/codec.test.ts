import { describe, expect, it } from "vitest";
import { decodeJson, encodeJson, encodeJsonWithMember, encodeWithMemberAdded } from "./codec.js";

describe("encodeJson", () => {
  it("encodes UTF-8 JSON, and undefined as no bytes", () => {
    expect(new TextDecoder().decode(encodeJson({ a: "é€😀", b: [1, null] }))).toBe(
      '{"a":"é€😀","b":[1,null]}',
    );
    expect(encodeJson(undefined)).toHaveLength(0);
  });
});

describe("encodeJsonWithMember", () => {
  it("gives the bytes of the object with the member added last", () => {
    const member = { role: "tool", content: 'quote " and \\ and é€😀\n' };
    const cases: object[] = [{}, { a: 1 }, { state: "running", nested: { x: [1, "two"] } }];
    for (const value of cases) {
      const bytes = encodeJsonWithMember(value, "result", encodeJson(member));
      expect(Buffer.from(bytes).equals(Buffer.from(encodeJson({ ...value, result: member })))).toBe(
        true,
      );
      expect(decodeJson(bytes)).toEqual({ ...value, result: member });
    }
  });
});

describe("encodeWithMemberAdded", () => {
  it("gives the bytes of the encoded object with the member added last", () => {
    const cases: object[] = [{}, { a: 1 }, { content: 'quote " and \\ and é€😀\n', n: [1, "two"] }];
    for (const value of cases) {
      const bytes = encodeWithMemberAdded(encodeJson(value), "args_hash", "sha256:é");
      expect(
        Buffer.from(bytes).equals(Buffer.from(encodeJson({ ...value, args_hash: "sha256:é" }))),
      ).toBe(true);
    }
  });
});
