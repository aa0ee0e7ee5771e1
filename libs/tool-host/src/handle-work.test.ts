import { describe, expect, it } from "vitest";
import { ErrorCode, RetryPolicySchema, ToolmeshError } from "@toolmesh/protocol";
import { ShutdownCode, afterAttempt, finalMessage, holdCall } from "./handle-work.js";

const call = { tool_call_id: "c1", tool: "echo", session_id: "s1" };
const retry = { retry: RetryPolicySchema.parse({ max_attempts: 3, initial_backoff_ms: 100 }) };
const FAR = 1e12;
const failed = (error: ToolmeshError) => ({ ok: false as const, error });

describe("afterAttempt", () => {
  it("ends a call whose attempt succeeded", () => {
    expect(afterAttempt({ ok: true, content: "x" }, 1, retry, FAR, 0)).toEqual({ kind: "end" });
  });

  it("hands back an attempt stopped by the executor's shutdown", () => {
    const stopped = new ToolmeshError(ErrorCode.Unavailable, "stopping", {
      details: { [ShutdownCode]: true },
    });
    expect(afterAttempt(failed(stopped), 1, retry, FAR, 0)).toEqual({ kind: "hand-back" });
  });

  it("retries a retryable failure while attempts and time remain, then ends the call", () => {
    const down = new ToolmeshError(ErrorCode.Unavailable, "down");
    expect(afterAttempt(failed(down), 1, retry, FAR, 0)).toEqual({
      kind: "retry",
      delayMs: 100,
      error: down,
    });
    expect(afterAttempt(failed(down), 3, retry, FAR, 0)).toEqual({ kind: "end" });
    expect(afterAttempt(failed(down), 1, retry, 50, 0)).toEqual({ kind: "end" });
  });

  it("ends the call on a terminal failure", () => {
    const bad = new ToolmeshError(ErrorCode.InvalidArguments, "bad", { retryable: false });
    expect(afterAttempt(failed(bad), 1, retry, FAR, 0)).toEqual({ kind: "end" });
  });
});

describe("finalMessage", () => {
  it("carries the content, the attempts and the duration, with the bytes it measured", () => {
    const { message, encoded } = finalMessage(call, { ok: true, content: "hi é" }, 2, 12.5, 1_000);
    expect(message).toEqual({
      role: "tool",
      tool_call_id: "c1",
      name: "echo",
      session_id: "s1",
      content: "hi é",
      attempts: 2,
      duration_ms: 12.5,
    });
    expect(Buffer.from(encoded).equals(Buffer.from(JSON.stringify(message), "utf8"))).toBe(true);
  });

  it("carries a failure as the message's error", () => {
    const { message } = finalMessage(
      call,
      failed(new ToolmeshError(ErrorCode.Timeout, "slow", { retryable: false })),
      1,
      5,
      1_000,
    );
    expect(message.error).toMatchObject({ code: "timeout", message: "slow" });
  });

  it("turns a result larger than the limit into payload_too_large", () => {
    const { message, encoded } = finalMessage(
      call,
      { ok: true, content: "x".repeat(2_000) },
      1,
      5,
      1_000,
    );
    expect(message.error).toMatchObject({ code: "payload_too_large", retryable: false });
    expect(Buffer.from(encoded).equals(Buffer.from(JSON.stringify(message), "utf8"))).toBe(true);
    expect(message.error?.details).toMatchObject({ limit: 1_000 });
    expect(message.content.length).toBeLessThan(1_000);
  });
});

describe("holdCall", () => {
  it("lets a second delivery of a call in only once the first is released", async () => {
    const inHand = new Map<string, Promise<void>>();
    const first = await holdCall(inHand, "k");
    expect(first.waited).toBe(false);
    let secondIn = false;
    const second = holdCall(inHand, "k").then((held) => {
      secondIn = true;
      return held;
    });
    await Promise.resolve();
    expect(secondIn).toBe(false);
    first.release();
    const held = await second;
    expect(held.waited).toBe(true);
    held.release();
    expect(inHand.size).toBe(0);
  });
});
