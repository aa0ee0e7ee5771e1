import { describe, expect, it } from "vitest";
import type { Msg } from "@nats-io/nats-core";
import { z } from "zod";
import { ErrorCode, ToolmeshError, decodeJson } from "@toolmesh/protocol";
import { createLogger } from "@toolmesh/telemetry";
import { answerRequest } from "./serve-requests.js";

const log = createLogger({ service: "test", level: "silent" });

/** A request as a subscription hands it over; `replies` collects what it answers. */
function request(body: string, reply = "_INBOX.test"): { msg: Msg; replies: unknown[] } {
  const replies: unknown[] = [];
  const msg = {
    subject: "t.v1.rpc.acme.thing",
    reply,
    data: new TextEncoder().encode(body),
    respond: (data: Uint8Array) => replies.push(decodeJson(data)) > 0,
  } as unknown as Msg;
  return { msg, replies };
}

const refusal = (error: unknown) => ({ refused: error });

describe("answerRequest", () => {
  it("hands the decoded body and the message to the handler and sends its reply", async () => {
    const { msg, replies } = request('{"x":1}');
    await answerRequest(msg, { log, refusal, handle: (body, m) => ({ body, subject: m.subject }) });
    expect(replies).toEqual([{ body: { x: 1 }, subject: "t.v1.rpc.acme.thing" }]);
  });

  it("refuses a body that is not JSON with invalid_request naming the request", async () => {
    const { msg, replies } = request("{not json");
    await answerRequest(msg, { log, refusal, what: "cancel request", handle: () => ({}) });
    expect(replies).toEqual([
      {
        refused: {
          code: ErrorCode.InvalidRequest,
          message: "cancel request is not JSON",
          retryable: false,
        },
      },
    ]);
  });

  it("refuses a body of the wrong shape with invalid_request and details.issues", async () => {
    const { msg, replies } = request("{}");
    const schema = z.object({ tool_call_id: z.string() });
    await answerRequest(msg, {
      log,
      refusal,
      what: "cancel request",
      handle: (body) => schema.parse(body),
    });
    expect(replies).toEqual([
      {
        refused: {
          code: ErrorCode.InvalidRequest,
          message: expect.stringMatching(/^malformed cancel request: \/tool_call_id /) as string,
          retryable: false,
          details: { issues: [{ path: "/tool_call_id", message: expect.any(String) as string }] },
        },
      },
    ]);
  });

  it("passes typed errors through and makes anything else unavailable", async () => {
    const typed = request("{}");
    await answerRequest(typed.msg, {
      log,
      refusal,
      handle: () => {
        throw new ToolmeshError(ErrorCode.PermissionDenied, "no");
      },
    });
    expect(typed.replies).toEqual([
      { refused: { code: "permission_denied", message: "no", retryable: false } },
    ]);
    const other = request("{}");
    await answerRequest(other.msg, {
      log,
      refusal,
      handle: () => Promise.reject(new Error("kv down")),
    });
    expect(other.replies).toEqual([
      { refused: { code: "unavailable", message: "kv down", retryable: true } },
    ]);
  });

  it("sends nothing for a message without a reply subject", async () => {
    const { msg, replies } = request("{}", "");
    await answerRequest(msg, { log, refusal, handle: () => ({ ok: true }) });
    expect(replies).toEqual([]);
  });
});
