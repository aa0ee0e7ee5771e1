import { ROOT_CONTEXT, TraceFlags, context, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { REDACTED, createLogger, lazyChild, type LoggerOptions } from "./logger.js";

const spanContext = {
  traceId: "4bf92f3577b34da6a3ce929d0e0e4736",
  spanId: "00f067aa0ba902b7",
  traceFlags: TraceFlags.SAMPLED,
};

function captureLogger(options: Omit<LoggerOptions, "destination">) {
  const lines: string[] = [];
  const logger = createLogger({
    ...options,
    destination: { write: (line: string) => void lines.push(line) },
  });
  const records = () => lines.map((line) => JSON.parse(line) as Record<string, unknown>);
  return { logger, lines, records };
}

beforeAll(() => {
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
});

afterAll(() => {
  context.disable();
});

describe("createLogger", () => {
  it("writes JSON with service, ISO time and the default level", () => {
    const { logger, records } = captureLogger({ service: "resolver" });
    logger.debug("hidden");
    logger.info({ callId: "c1" }, "resolved");

    expect(records()).toHaveLength(1);
    const [record] = records();
    expect(record).toMatchObject({ service: "resolver", callId: "c1", msg: "resolved", level: 30 });
    expect(record?.time).toMatch(/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/);
  });

  it("redacts secrets and preset values by default, plus caller paths", () => {
    const { logger, lines, records } = captureLogger({
      service: "executor",
      redact: ["call.arguments.ssn"],
    });
    logger.info(
      {
        presets: { region: "eu-west-1", api_key: "preset-key" },
        secret: "top-secret",
        user: { name: "ada", password: "hunter2", apiKey: "ak-123" },
        request: { headers: { authorization: "Bearer abc", accept: "json" }, token: "tok-1" },
        call: {
          tool: "lookup",
          preset_values: { account: "acct-9" },
          arguments: { ssn: "123-45-6789", q: "ok" },
        },
      },
      "calling",
    );

    const [line] = lines;
    for (const leaked of [
      "eu-west-1",
      "preset-key",
      "top-secret",
      "hunter2",
      "ak-123",
      "Bearer abc",
      "tok-1",
      "acct-9",
      "123-45-6789",
    ]) {
      expect(line).not.toContain(leaked);
    }
    expect(records()[0]).toMatchObject({
      presets: REDACTED,
      secret: REDACTED,
      user: { name: "ada", password: REDACTED, apiKey: REDACTED },
      request: { headers: { authorization: REDACTED, accept: "json" }, token: REDACTED },
      call: { tool: "lookup", preset_values: REDACTED, arguments: { ssn: REDACTED, q: "ok" } },
    });
  });

  it("adds trace_id and span_id only inside an active span", () => {
    const { logger, records } = captureLogger({ service: "client" });
    logger.info("outside");
    context.with(trace.setSpanContext(ROOT_CONTEXT, spanContext), () => logger.info("inside"));

    const [outside, inside] = records();
    expect(outside).not.toHaveProperty("trace_id");
    expect(outside).not.toHaveProperty("span_id");
    expect(inside).toMatchObject({
      trace_id: spanContext.traceId,
      span_id: spanContext.spanId,
      msg: "inside",
    });
  });
});

describe("lazyChild", () => {
  it("makes the child only when a line is written, and writes it as the child would", () => {
    const { logger, records } = captureLogger({ service: "executor" });
    const child = vi.spyOn(logger, "child");
    const callLog = lazyChild(logger, { callId: "c1", user: { password: "hunter2" } });
    callLog.debug("below the level");
    expect(child).not.toHaveBeenCalled();
    expect(records()).toEqual([]);

    callLog.info({ attempt: 2 }, "ran");
    callLog.warn("twice");
    expect(child).toHaveBeenCalledTimes(1);
    expect(records()).toMatchObject([
      { callId: "c1", attempt: 2, msg: "ran", user: { password: REDACTED } },
      { callId: "c1", msg: "twice", level: 40 },
    ]);
    // A grandchild (a tool's own) keeps the bindings.
    callLog.child({ step: "x" }).error("failed");
    expect(records()[2]).toMatchObject({ callId: "c1", step: "x", level: 50 });
    expect(callLog.isLevelEnabled("debug")).toBe(false);
    // A level set through it is the child's: the parent keeps its own.
    callLog.level = "debug";
    callLog.debug("now written");
    logger.debug("still not");
    expect(records().map((r) => r.msg)).toEqual(["ran", "twice", "failed", "now written"]);
    expect(logger.level).toBe("info");
  });
});
