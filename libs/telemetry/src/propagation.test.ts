import { ROOT_CONTEXT, TraceFlags, context, propagation, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { extractTraceContext, injectTraceHeaders, type TraceHeaders } from "./propagation.js";

/** Behaves like nats-core's MsgHdrs for the calls made here: case-sensitive keys, `""` when missing. */
class FakeMsgHdrs implements TraceHeaders {
  readonly entries = new Map<string, string>();
  get(k: string): string {
    return this.entries.get(k) ?? "";
  }
  set(k: string, v: string): void {
    this.entries.set(k, v);
  }
  has(k: string): boolean {
    return this.entries.has(k);
  }
  keys(): string[] {
    return [...this.entries.keys()];
  }
}

const spanContext = {
  traceId: "4bf92f3577b34da6a3ce929d0e0e4736",
  spanId: "00f067aa0ba902b7",
  traceFlags: TraceFlags.SAMPLED,
};
const traceparent = `00-${spanContext.traceId}-${spanContext.spanId}-01`;

beforeAll(() => {
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
});

afterAll(() => {
  propagation.disable();
  context.disable();
});

describe("injectTraceHeaders / extractTraceContext", () => {
  it("round-trips the trace through headers, from the active context by default", () => {
    const headers = new FakeMsgHdrs();
    context.with(trace.setSpanContext(ROOT_CONTEXT, spanContext), () =>
      injectTraceHeaders(headers),
    );
    expect(headers.get("traceparent")).toBe(traceparent);

    const extracted = trace.getSpanContext(extractTraceContext(headers));
    expect(extracted).toMatchObject({ ...spanContext, isRemote: true });
  });

  it("carries tracestate", () => {
    const headers = new FakeMsgHdrs();
    headers.set("traceparent", traceparent);
    headers.set("tracestate", "vendor=abc");
    const ctx = extractTraceContext(headers);

    const forwarded = new FakeMsgHdrs();
    injectTraceHeaders(forwarded, ctx);
    expect(forwarded.get("tracestate")).toBe("vendor=abc");
  });

  it("reads a traceparent whose key was canonicalised by an HTTP-style producer", () => {
    const headers = new FakeMsgHdrs();
    headers.set("Traceparent", traceparent);
    expect(trace.getSpanContext(extractTraceContext(headers))?.traceId).toBe(spanContext.traceId);
  });

  it("writes nothing without a span and finds nothing in empty or missing headers", () => {
    const headers = new FakeMsgHdrs();
    injectTraceHeaders(headers, ROOT_CONTEXT);
    expect(headers.keys()).toEqual([]);

    expect(trace.getSpanContext(extractTraceContext(headers))).toBeUndefined();
    expect(extractTraceContext(undefined)).toBe(ROOT_CONTEXT);
  });

  it("ignores a malformed traceparent", () => {
    const headers = new FakeMsgHdrs();
    headers.set("traceparent", "00-not-a-trace-01");
    expect(trace.getSpanContext(extractTraceContext(headers))).toBeUndefined();
  });
});
