import { headers } from "@nats-io/nats-core";
import {
  ATTR_MESSAGING_DESTINATION_NAME,
  ATTR_MESSAGING_OPERATION_TYPE,
  ATTR_MESSAGING_SYSTEM,
  ATTR_TOOLMESH_ATTEMPT,
  ATTR_TOOLMESH_CALL_ID,
  MESSAGING_SYSTEM_VALUE_NATS,
  MessagingOperationType,
  SpanKind,
  extractTraceContext,
  injectTraceHeaders,
  withSpan,
  type Telemetry,
} from "@toolmesh/telemetry";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import {
  freshTelemetry,
  startOtlpReceiver,
  type CollectedSpan,
  type OtlpReceiver,
} from "./helpers/otlp-receiver.js";

const OTLP_KIND_PRODUCER = 4;
const OTLP_KIND_CONSUMER = 5;

let receiver: OtlpReceiver;
let telemetry: Telemetry | undefined;

beforeAll(async () => {
  receiver = await startOtlpReceiver();
});

afterEach(async () => {
  await telemetry?.shutdown();
  telemetry = undefined;
});

afterAll(async () => {
  await receiver.close();
});

const named = (spans: CollectedSpan[], name: string) => spans.find((span) => span.name === name);

describe("trace export over OTLP/HTTP", () => {
  it("exports a parent and child with their link and the service name on forceFlush", async () => {
    telemetry = await freshTelemetry({
      serviceName: "toolmesh-export-test",
      serviceVersion: "0.0.1",
      env: { OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url, OTEL_BSP_SCHEDULE_DELAY: "50" },
    });
    expect(telemetry.enabled).toBe(true);
    const { tracer } = telemetry;

    await withSpan(
      tracer,
      "flush.parent",
      {
        kind: SpanKind.PRODUCER,
        attributes: { [ATTR_TOOLMESH_CALL_ID]: "call-1", [ATTR_TOOLMESH_ATTEMPT]: 2 },
      },
      async () => {
        await withSpan(tracer, "flush.child", { kind: SpanKind.CONSUMER }, async () => undefined);
      },
    );
    await telemetry.forceFlush();

    const spans = await receiver.waitFor(
      (all) => named(all, "flush.parent") !== undefined && named(all, "flush.child") !== undefined,
    );
    const parent = named(spans, "flush.parent");
    const child = named(spans, "flush.child");
    expect(parent).toMatchObject({
      service: "toolmesh-export-test",
      kind: OTLP_KIND_PRODUCER,
      parentSpanId: undefined,
      attributes: { [ATTR_TOOLMESH_CALL_ID]: "call-1", [ATTR_TOOLMESH_ATTEMPT]: 2 },
    });
    expect(parent?.traceId).toMatch(/^[0-9a-f]{32}$/);
    expect(child).toMatchObject({
      service: "toolmesh-export-test",
      kind: OTLP_KIND_CONSUMER,
      traceId: parent?.traceId,
      parentSpanId: parent?.spanId,
    });
  });

  it("exports on the OTEL_BSP_SCHEDULE_DELAY from env, and links hops through NATS headers", async () => {
    // OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is used as given; no forceFlush, so only the 50 ms batch
    // delay read from `env` gets the spans out before the 3 s wait (the SDK default is 5 s).
    telemetry = await freshTelemetry({
      serviceName: "toolmesh-hop-test",
      env: {
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: `${receiver.url}/v1/traces`,
        OTEL_BSP_SCHEDULE_DELAY: "50",
      },
    });
    const { tracer } = telemetry;
    const subject = "toolmesh.calls.lookup";
    const msgHeaders = headers();

    await withSpan(
      tracer,
      `${subject} publish`,
      {
        kind: SpanKind.PRODUCER,
        attributes: {
          [ATTR_MESSAGING_SYSTEM]: MESSAGING_SYSTEM_VALUE_NATS,
          [ATTR_MESSAGING_DESTINATION_NAME]: subject,
          [ATTR_MESSAGING_OPERATION_TYPE]: MessagingOperationType.Publish,
        },
      },
      async () => injectTraceHeaders(msgHeaders),
    );
    await withSpan(
      tracer,
      `${subject} process`,
      { kind: SpanKind.CONSUMER, parent: extractTraceContext(msgHeaders) },
      async () => undefined,
    );

    const spans = await receiver.waitFor(
      (all) =>
        named(all, `${subject} publish`) !== undefined &&
        named(all, `${subject} process`) !== undefined,
      3_000,
    );
    const publish = named(spans, `${subject} publish`);
    const processed = named(spans, `${subject} process`);
    expect(publish?.attributes).toEqual({
      "messaging.system": "nats",
      "messaging.destination.name": subject,
      "messaging.operation.type": "publish",
    });
    expect(processed).toMatchObject({
      service: "toolmesh-hop-test",
      traceId: publish?.traceId,
      parentSpanId: publish?.spanId,
    });
  });
});
