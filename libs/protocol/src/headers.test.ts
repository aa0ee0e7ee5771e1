import { describe, expect, it } from "vitest";
import { callKeyOfResultMsgId, resultMsgId } from "./msg-ids.js";

describe("result message ids", () => {
  it("builds the final message's id from the call key, and another call id's from its token", () => {
    expect(resultMsgId("t.s.k")).toBe("result:t.s.k");
    expect(resultMsgId("t.s.k", "c2")).toBe("result:t.s.k:c2");
  });

  it("reads the call key back, and nothing from other message ids", () => {
    expect(callKeyOfResultMsgId(resultMsgId("t.s.k"))).toBe("t.s.k");
    expect(callKeyOfResultMsgId("rejected:t.s.k:7")).toBeUndefined();
    expect(callKeyOfResultMsgId("")).toBeUndefined();
  });
});
