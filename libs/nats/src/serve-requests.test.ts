import { describe, expect, it } from "vitest";
import type { Msg } from "@nats-io/nats-core";
import { TimeoutError } from "@nats-io/nats-core";
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

  it("passes typed errors through, makes NATS failures unavailable and bugs internal", async () => {
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
    const nats = request("{}");
    await answerRequest(nats.msg, {
      log,
      refusal,
      handle: () => Promise.reject(new TimeoutError()),
    });
    expect(nats.replies).toEqual([
      { refused: { code: "unavailable", message: "timeout", retryable: true } },
    ]);
    const thrown = request("{}");
    await answerRequest(thrown.msg, {
      log,
      refusal,
      handle: () => {
        throw new TypeError("x is undefined");
      },
    });
    const rejected = request("{}");
    await answerRequest(rejected.msg, {
      log,
      refusal,
      handle: () => Promise.reject(new Error("bug")),
    });
    expect([...thrown.replies, ...rejected.replies]).toEqual([
      { refused: { code: "internal", message: "x is undefined", retryable: true } },
      { refused: { code: "internal", message: "bug", retryable: true } },
    ]);
  });

  it("answers a failure in the one envelope, { ok: false, error }, unless told otherwise", async () => {
    const { msg, replies } = request("{not json");
    await answerRequest(msg, { log, handle: () => ({}) });
    expect(replies).toEqual([
      {
        ok: false,
        error: { code: "invalid_request", message: "request is not JSON", retryable: false },
      },
    ]);
  });

  it("hands the handler the scope its hook read, and refuses what the hook refuses", async () => {
    const scope = (m: Msg): string => {
      const token = m.subject.split(".")[3];
      if (token === "acme") return token;
      throw new ToolmeshError(ErrorCode.InvalidRequest, "no tenant");
    };
    const { msg, replies } = request("{}");
    await answerRequest(msg, { log, refusal, scope, handle: (_b, _m, tenant) => ({ tenant }) });
    const other = request("{}");
    other.msg.subject = "t.v1.rpc.globex.thing";
    let handled = false;
    await answerRequest(other.msg, {
      log,
      refusal,
      scope,
      handle: () => (handled = true),
    });
    expect(replies).toEqual([{ tenant: "acme" }]);
    expect(other.replies).toEqual([
      { refused: { code: "invalid_request", message: "no tenant", retryable: false } },
    ]);
    expect(handled).toBe(false);
  });

  it("refuses a request over its limit with payload_too_large before the handler runs", async () => {
    const { msg, replies } = request(JSON.stringify({ text: "x".repeat(100) }));
    let handled = false;
    await answerRequest(msg, {
      log,
      refusal,
      what: "dry-run request",
      maxRequestBytes: 64,
      handle: () => (handled = true),
    });
    expect(handled).toBe(false);
    expect(replies).toEqual([
      {
        refused: {
          code: "payload_too_large",
          message: "the dry-run request is 111 bytes; it may have at most 64",
          retryable: false,
          details: { field: "request", bytes: 111, limit: 64 },
        },
      },
    ]);
  });

  it("replaces a reply over the limit by payload_too_large naming its size", async () => {
    const { msg, replies } = request("{}");
    await answerRequest(msg, {
      log,
      refusal,
      maxReplyBytes: 1_000,
      handle: () => ({ text: "x".repeat(2_000) }),
    });
    expect(replies).toEqual([
      {
        refused: {
          code: "payload_too_large",
          message:
            "the answer to this request would be 2011 bytes; the server carries at most 1000",
          retryable: false,
          details: { field: "reply", bytes: 2011, limit: 1000 },
        },
      },
    ]);
  });

  it("never rejects, even when the reply cannot be sent", async () => {
    const { msg } = request("{}");
    (msg as { respond: unknown }).respond = () => {
      throw new Error("connection closed");
    };
    await expect(answerRequest(msg, { log, refusal, handle: () => ({}) })).resolves.toBeUndefined();
  });

  it("sends nothing for a message without a reply subject", async () => {
    const { msg, replies } = request("{}", "");
    await answerRequest(msg, { log, refusal, handle: () => ({ ok: true }) });
    expect(replies).toEqual([]);
  });
});
