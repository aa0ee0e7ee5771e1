import { describe, expect, it } from "vitest";
import {
  ProtocolError,
  ProtocolErrorCode,
  SdkError,
  SdkErrorCode,
  SdkHttpError,
  SseError,
  UnauthorizedError,
} from "@modelcontextprotocol/client";
import type { CallToolResult } from "@modelcontextprotocol/client";
import { ToolmeshError } from "@toolmesh/protocol";
import { callError, failureKind, resultContent, resultError } from "./result.js";

/** An HTTP error answer as the SDK's streamable HTTP transport throws it. */
function httpError(status: number, text: string): SdkHttpError {
  return new SdkHttpError(
    SdkErrorCode.ClientHttpNotImplemented,
    `Error POSTing to endpoint: ${text}`,
    { status, statusText: "", text },
  );
}

const image = { type: "image", data: "iVBORw0=", mimeType: "image/png" } as const;

describe("resultContent", () => {
  it("gives a single text block as it is", () => {
    expect(resultContent({ content: [{ type: "text", text: "Echo: hi" }] })).toBe("Echo: hi");
  });

  it("gives the text when it repeats the structured content", () => {
    const structuredContent = { temperature: 21, conditions: "sunny" };
    expect(
      resultContent({
        content: [{ type: "text", text: JSON.stringify(structuredContent, null, 2) }],
        structuredContent,
      }),
    ).toBe(JSON.stringify(structuredContent, null, 2));
  });

  it("keeps structured content the text does not repeat", () => {
    const result: CallToolResult = {
      content: [{ type: "text", text: "it is sunny" }],
      structuredContent: { temperature: 21 },
    };
    expect(JSON.parse(resultContent(result))).toEqual({
      content: [{ type: "text", text: "it is sunny" }],
      structuredContent: { temperature: 21 },
    });
  });

  it("gives the JSON of every block for anything else, binary data as sent", () => {
    const blocks: CallToolResult["content"] = [
      { type: "text", text: "look" },
      image,
      { type: "audio", data: "UklGRg==", mimeType: "audio/wav" },
      { type: "resource", resource: { uri: "file:///a.txt", text: "a", mimeType: "text/plain" } },
      { type: "resource_link", uri: "file:///b.txt", name: "b" },
    ];
    expect(JSON.parse(resultContent({ content: blocks }))).toEqual({ content: blocks });
    expect(JSON.parse(resultContent({ content: [image] }))).toEqual({ content: [image] });
  });

  it("gives structured content alone as JSON and nothing as an empty string", () => {
    expect(JSON.parse(resultContent({ content: [], structuredContent: { n: 1 } }))).toEqual({
      content: [],
      structuredContent: { n: 1 },
    });
    expect(resultContent({ content: [] })).toBe("");
  });

  it("gives the text when the structured content only wraps it", () => {
    const text = "line one\nline two";
    expect(
      resultContent({ content: [{ type: "text", text }], structuredContent: { content: text } }),
    ).toBe(text);
  });

  it("follows the server's structured_content choice", () => {
    const result: CallToolResult = {
      content: [{ type: "text", text: "it is sunny" }],
      structuredContent: { temperature: 21 },
    };
    expect(resultContent(result, "content")).toBe("it is sunny");
    expect(JSON.parse(resultContent(result, "structured"))).toEqual({ temperature: 21 });
    expect(resultContent({ content: [{ type: "text", text: "x" }] }, "structured")).toBe("x");
  });

  it("drops the result's _meta", () => {
    expect(resultContent({ content: [{ type: "text", text: "x" }], _meta: { trace: "abc" } })).toBe(
      "x",
    );
  });
});

describe("resultError", () => {
  it("is a terminal tool_error carrying the server's content", () => {
    const error = resultError(
      { content: [{ type: "text", text: "disk full" }, image], isError: true },
      "files",
      "write",
    );
    expect(error.toWire()).toEqual({
      code: "tool_error",
      message: "disk full",
      retryable: false,
      details: {
        server: "files",
        tool: "write",
        content: [{ type: "text", text: "disk full" }, image],
      },
    });
  });

  it("says which tool failed when the server gave no text", () => {
    expect(resultError({ content: [], isError: true }, "s", "t").message).toBe(
      'MCP tool "t" of server "s" reported an error',
    );
  });
});

describe("callError", () => {
  const mapped = (err: unknown): [string, boolean] => {
    const e = callError(err, "s", "t");
    return [e.code, e.retryable];
  };

  it("maps JSON-RPC errors", () => {
    expect(mapped(new ProtocolError(ProtocolErrorCode.MethodNotFound, "no such method"))).toEqual([
      "unknown_tool",
      false,
    ]);
    expect(
      mapped(new ProtocolError(ProtocolErrorCode.InvalidParams, "Unknown tool: nope")),
    ).toEqual(["unknown_tool", false]);
    expect(
      mapped(new ProtocolError(ProtocolErrorCode.InvalidParams, "Tool nope not found")),
    ).toEqual(["unknown_tool", false]);
    expect(
      mapped(new ProtocolError(ProtocolErrorCode.InvalidParams, "a must be a number")),
    ).toEqual(["invalid_parameters", false]);
    expect(mapped(new SdkError(SdkErrorCode.ConnectionClosed, "Connection closed"))).toEqual([
      "unavailable",
      true,
    ]);
    expect(mapped(new ProtocolError(ProtocolErrorCode.InternalError, "boom"))).toEqual([
      "tool_error",
      false,
    ]);
    const retried = callError(
      new ProtocolError(ProtocolErrorCode.InternalError, "busy"),
      "s",
      "t",
      "retry",
    );
    expect([retried.code, retried.retryable]).toEqual(["tool_error", true]);
    expect(mapped(new ProtocolError(-31000, "custom"))).toEqual(["tool_error", false]);
  });

  it("keeps the JSON-RPC code and data in details, without the SDK's message prefix", () => {
    const error = callError(
      new ProtocolError(ProtocolErrorCode.InvalidParams, "MCP error -32602: bad a", { path: "/a" }),
      "s",
      "t",
    );
    expect(error.message).toBe("bad a");
    expect(error.details).toEqual({
      server: "s",
      tool: "t",
      jsonrpc_code: -32602,
      data: { path: "/a" },
    });
  });

  it("maps HTTP failures and unreachable servers", () => {
    expect(mapped(httpError(401, "Unauthorized"))).toEqual(["permission_denied", false]);
    expect(mapped(httpError(403, "Forbidden"))).toEqual(["permission_denied", false]);
    expect(mapped(httpError(503, "Busy"))).toEqual(["unavailable", true]);
    expect(mapped(httpError(400, "Bad"))).toEqual(["tool_error", false]);
    const reasoned = callError(
      httpError(422, '{"jsonrpc":"2.0","error":{"code":-32600,"message":"too big"},"id":1}'),
      "s",
      "t",
    );
    expect(reasoned.message).toBe('MCP server "s" answered HTTP 422: too big');
    expect(reasoned.details).toMatchObject({ http_status: 422, reason: "too big" });
    const plain = callError(httpError(413, "request entity too large"), "s", "t");
    expect(plain.message).toBe('MCP server "s" answered HTTP 413: request entity too large');
    const refused = new TypeError("fetch failed", { cause: { code: "ECONNREFUSED" } });
    const error = callError(refused, "s", "t");
    expect([error.code, error.retryable]).toEqual(["unavailable", true]);
    expect(error.message).toBe('MCP server "s" is unavailable: fetch failed: ECONNREFUSED');
  });

  it("maps the SDK's own failures and an unauthorised connection", () => {
    expect(mapped(new SdkError(SdkErrorCode.RequestTimeout, "Request timed out"))).toEqual([
      "timeout",
      true,
    ]);
    const invalid = callError(new SdkError(SdkErrorCode.InvalidResult, "bad result"), "s", "t");
    expect([invalid.code, invalid.retryable]).toEqual(["tool_error", false]);
    expect(invalid.details).toMatchObject({ sdk_code: SdkErrorCode.InvalidResult });
    expect(mapped(new SdkError(SdkErrorCode.NotConnected, "Not connected"))).toEqual([
      "unavailable",
      true,
    ]);
    expect(mapped(new SseError(502, "Bad gateway", undefined))).toEqual(["unavailable", true]);
    expect(mapped(new UnauthorizedError())).toEqual(["permission_denied", false]);
  });

  it("passes typed errors through", () => {
    const typed = new ToolmeshError("timeout", "attempt timed out");
    expect(callError(typed, "s", "t")).toBe(typed);
  });
});

describe("failureKind", () => {
  it("tells broken connections and expired sessions from answers", () => {
    expect(failureKind(httpError(404, "Session not found"))).toBe("session_expired");
    expect(failureKind(httpError(502, "Bad gateway"))).toBe("connection");
    expect(failureKind(httpError(400, "Bad request"))).toBe("answered");
    // What servers built on the SDK's examples (server-everything) answer after a restart.
    const unknownSession =
      '{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: No valid session ID provided"},"id":3}';
    expect(failureKind(httpError(400, unknownSession))).toBe("session_expired");
    expect(failureKind(new SdkError(SdkErrorCode.ConnectionClosed, "closed"))).toBe("connection");
    expect(failureKind(new ProtocolError(ProtocolErrorCode.InvalidParams, "bad"))).toBe("answered");
    expect(failureKind(new SdkError(SdkErrorCode.RequestTimeout, "timed out"))).toBe("connection");
    expect(failureKind(new SdkError(SdkErrorCode.InvalidResult, "bad result"))).toBe("answered");
    expect(failureKind(new SseError(502, "Bad gateway", undefined))).toBe("connection");
    expect(failureKind(new UnauthorizedError())).toBe("answered");
    expect(failureKind(new TypeError("fetch failed"))).toBe("connection");
  });
});
