import { describe, expect, it } from "vitest";
import { ErrorCode } from "@toolmesh/protocol";
import { publishError } from "./publish.js";

describe("publishError", () => {
  it("reports a value JSON.stringify cannot encode without the engine's words", () => {
    let overflow: unknown;
    try {
      const deep = JSON.parse(`${"[".repeat(100_000)}${"]".repeat(100_000)}`) as unknown;
      JSON.stringify(deep);
    } catch (err) {
      overflow = err;
    }
    expect(overflow).toBeInstanceOf(RangeError);
    const error = publishError(overflow, "a.subject");
    expect(error.toWire()).toEqual({
      code: ErrorCode.Internal,
      message: "message cannot be encoded as JSON: it nests too deeply or is too large",
      retryable: false,
      details: { subject: "a.subject" },
    });
  });
});
