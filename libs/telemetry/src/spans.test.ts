import {
  ROOT_CONTEXT,
  SpanKind,
  SpanStatusCode,
  TraceFlags,
  context,
  trace,
  type Tracer,
} from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  SimpleSpanProcessor,
} from "@opentelemetry/sdk-trace-base";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { ATTR_MESSAGING_DESTINATION_NAME, ATTR_TOOLMESH_CALL_ID } from "./semconv.js";
import { traceIdOf, withSpan } from "./spans.js";

const exporter = new InMemorySpanExporter();
const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
const tracer = provider.getTracer("spans-test");

beforeAll(() => {
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
});

afterEach(() => {
  exporter.reset();
});

afterAll(async () => {
  context.disable();
  await provider.shutdown();
});

describe("withSpan", () => {
  it("runs fn inside the span, returns its value and ends the span", async () => {
    const result = await withSpan(
      tracer,
      "tools.lookup publish",
      { kind: SpanKind.PRODUCER, attributes: { [ATTR_TOOLMESH_CALL_ID]: "c1" } },
      async (span) => {
        expect(trace.getActiveSpan()).toBe(span);
        expect(traceIdOf()).toBe(span.spanContext().traceId);
        return 42;
      },
    );

    expect(result).toBe(42);
    const [finished] = exporter.getFinishedSpans();
    expect(finished).toMatchObject({
      name: "tools.lookup publish",
      kind: SpanKind.PRODUCER,
      attributes: { [ATTR_TOOLMESH_CALL_ID]: "c1" },
      status: { code: SpanStatusCode.UNSET },
    });
  });

  it("records the exception, sets ERROR status, rethrows and still ends the span", async () => {
    const failure = new Error("tool exploded");
    await expect(
      withSpan(tracer, "tools.lookup process", { kind: SpanKind.CONSUMER }, async () => {
        throw failure;
      }),
    ).rejects.toBe(failure);

    const finished = exporter.getFinishedSpans();
    expect(finished).toHaveLength(1);
    expect(finished[0]?.status).toEqual({ code: SpanStatusCode.ERROR, message: "tool exploded" });
    expect(finished[0]?.events.map((event) => event.name)).toEqual(["exception"]);
    expect(finished[0]?.events[0]?.attributes?.["exception.message"]).toBe("tool exploded");
  });

  it("parents the span on an explicit context, such as one extracted from headers", async () => {
    const remote = {
      traceId: "4bf92f3577b34da6a3ce929d0e0e4736",
      spanId: "00f067aa0ba902b7",
      traceFlags: TraceFlags.SAMPLED,
      isRemote: true,
    };
    const parent = trace.setSpanContext(ROOT_CONTEXT, remote);
    await withSpan(
      tracer,
      "tools.lookup process",
      {
        kind: SpanKind.CONSUMER,
        parent,
        attributes: { [ATTR_MESSAGING_DESTINATION_NAME]: "tools.lookup" },
      },
      async () => {
        await withSpan(tracer, "validate", { kind: SpanKind.INTERNAL }, async () => undefined);
      },
    );

    const [child, consumer] = exporter.getFinishedSpans();
    expect(consumer?.spanContext().traceId).toBe(remote.traceId);
    expect(consumer?.parentSpanContext?.spanId).toBe(remote.spanId);
    expect(child?.parentSpanContext?.spanId).toBe(consumer?.spanContext().spanId);
  });

  it("still runs fn when the tracer throws", async () => {
    const broken = {
      startSpan: () => {
        throw new Error("tracer broken");
      },
    } as unknown as Tracer;
    const parent = trace.setSpanContext(ROOT_CONTEXT, {
      traceId: "4bf92f3577b34da6a3ce929d0e0e4736",
      spanId: "00f067aa0ba902b7",
      traceFlags: TraceFlags.SAMPLED,
    });
    const seen = await withSpan(broken, "x", { kind: SpanKind.INTERNAL, parent }, async () =>
      traceIdOf(),
    );
    expect(seen).toBe("4bf92f3577b34da6a3ce929d0e0e4736");
  });
});

describe("traceIdOf", () => {
  it("is undefined without a span", () => {
    expect(traceIdOf()).toBeUndefined();
    expect(traceIdOf(ROOT_CONTEXT)).toBeUndefined();
  });
});
