import { ROOT_CONTEXT, TraceFlags, trace } from "@opentelemetry/api";
import { afterEach, describe, expect, it } from "vitest";
import { injectTraceHeaders, type TraceHeaders } from "./propagation.js";
import { TelemetryConfigError, initTelemetry, type Telemetry } from "./tracing.js";

// Port 9 (discard) is never contacted: these tests end no spans, so nothing is exported.
const endpoint = "http://127.0.0.1:9";
const started: Telemetry[] = [];

function init(env: Record<string, string>): Telemetry {
  const telemetry = initTelemetry({ serviceName: "tracing-test", env });
  started.push(telemetry);
  return telemetry;
}

function injected(): Map<string, string> {
  const entries = new Map<string, string>();
  const headers: TraceHeaders = {
    get: (k) => entries.get(k) ?? "",
    set: (k, v) => void entries.set(k, v),
  };
  const ctx = trace.setSpanContext(ROOT_CONTEXT, {
    traceId: "4bf92f3577b34da6a3ce929d0e0e4736",
    spanId: "00f067aa0ba902b7",
    traceFlags: TraceFlags.SAMPLED,
  });
  injectTraceHeaders(headers, ctx);
  return entries;
}

afterEach(async () => {
  await Promise.all(started.splice(0).map((telemetry) => telemetry.shutdown()));
});

describe("initTelemetry", () => {
  it.each([
    ["no endpoint", {}],
    ["an empty endpoint", { OTEL_EXPORTER_OTLP_ENDPOINT: " " }],
    [
      "OTEL_SDK_DISABLED=true",
      { OTEL_EXPORTER_OTLP_ENDPOINT: endpoint, OTEL_SDK_DISABLED: "TRUE" },
    ],
    [
      "OTEL_TRACES_EXPORTER=none",
      { OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: endpoint, OTEL_TRACES_EXPORTER: "none" },
    ],
  ])("is off with %s", async (_case, env: Record<string, string>) => {
    const telemetry = init(env);
    expect(telemetry.enabled).toBe(false);
    expect(telemetry.tracer.startSpan("noop").isRecording()).toBe(false);
    expect(injected().size).toBe(0);
    await expect(telemetry.forceFlush()).resolves.toBeUndefined();
  });

  it("is on with an endpoint, registers W3C propagation and returns one handle per process", async () => {
    const telemetry = init({ OTEL_EXPORTER_OTLP_ENDPOINT: endpoint });
    expect(telemetry.enabled).toBe(true);
    expect(initTelemetry({ serviceName: "other", env: {} })).toBe(telemetry);
    expect(injected().get("traceparent")).toBe(
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    );

    await telemetry.shutdown();
    await expect(telemetry.shutdown()).resolves.toBeUndefined();
    expect(injected().size).toBe(0);
    const next = init({});
    expect(next).not.toBe(telemetry);
    expect(next.enabled).toBe(false);
  });

  it.each([
    ["OTEL_EXPORTER_OTLP_ENDPOINT", { OTEL_EXPORTER_OTLP_ENDPOINT: "collector:4318" }],
    [
      "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
      { OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: "ftp://collector/v1/traces" },
    ],
    [
      "OTEL_BSP_SCHEDULE_DELAY",
      { OTEL_EXPORTER_OTLP_ENDPOINT: endpoint, OTEL_BSP_SCHEDULE_DELAY: "soon" },
    ],
    [
      "OTEL_EXPORTER_OTLP_TIMEOUT",
      { OTEL_EXPORTER_OTLP_ENDPOINT: endpoint, OTEL_EXPORTER_OTLP_TIMEOUT: "0" },
    ],
    [
      "OTEL_EXPORTER_OTLP_PROTOCOL",
      { OTEL_EXPORTER_OTLP_ENDPOINT: endpoint, OTEL_EXPORTER_OTLP_PROTOCOL: "grpc" },
    ],
  ])(
    "refuses a malformed %s without registering anything",
    (variable, env: Record<string, string>) => {
      expect(() => init(env)).toThrow(
        expect.objectContaining({ name: "TelemetryConfigError", variable }),
      );
      expect(() => init(env)).toThrow(TelemetryConfigError);
      expect(injected().size).toBe(0);
      expect(init({ OTEL_EXPORTER_OTLP_ENDPOINT: endpoint }).enabled).toBe(true);
    },
  );

  it("lets a signal-specific protocol override a grpc default", () => {
    const telemetry = init({
      OTEL_EXPORTER_OTLP_ENDPOINT: endpoint,
      OTEL_EXPORTER_OTLP_PROTOCOL: "grpc",
      OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: "http/json",
    });
    expect(telemetry.enabled).toBe(true);
  });
});
