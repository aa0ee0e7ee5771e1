/**
 * A minimal OTLP/HTTP JSON trace receiver for integration tests: a real `node:http` server on
 * 127.0.0.1 and a kernel-picked port that stores the spans it is sent, flattened for assertions.
 * Point `OTEL_EXPORTER_OTLP_ENDPOINT` at `url`.
 */
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { gunzipSync } from "node:zlib";
import { initTelemetry } from "@toolmesh/telemetry";
import type { Telemetry, TelemetryOptions } from "@toolmesh/telemetry";

/** One received span. Ids are lowercase hex, as in OTLP JSON. */
export interface CollectedSpan {
  traceId: string;
  spanId: string;
  /** Undefined for a root span. */
  parentSpanId: string | undefined;
  name: string;
  /** OTLP span kind: 1 internal, 2 server, 3 client, 4 producer, 5 consumer. */
  kind: number;
  /** The `service.name` resource attribute, if sent. */
  service: string | undefined;
  attributes: Record<string, unknown>;
  /** Spans this one links to (a retry's earlier attempt). */
  links: { traceId: string; spanId: string }[];
  /** OTLP status code: 0 unset, 1 ok, 2 error. */
  statusCode: number;
}

/** A running receiver. */
export interface OtlpReceiver {
  /** Base URL without a trailing slash, e.g. `http://127.0.0.1:41234`. */
  readonly url: string;
  /** A copy of every span received so far, in arrival order. */
  spans(): CollectedSpan[];
  /**
   * Resolves with all spans once `predicate` holds, checking now and after each received batch.
   * Rejects after `timeoutMs` (default 10000) or on `close()`.
   */
  waitFor(
    predicate: (spans: CollectedSpan[]) => boolean,
    timeoutMs?: number,
  ): Promise<CollectedSpan[]>;
  /** Stops the server, dropping keep-alive connections, and rejects pending waits. Idempotent. */
  close(): Promise<void>;
}

interface OtlpKeyValue {
  key: string;
  value?: OtlpAnyValue;
}

interface OtlpAnyValue {
  stringValue?: string;
  boolValue?: boolean;
  intValue?: number | string;
  doubleValue?: number;
  bytesValue?: string;
  arrayValue?: { values?: OtlpAnyValue[] };
  kvlistValue?: { values?: OtlpKeyValue[] };
}

interface OtlpTraceRequest {
  resourceSpans?: {
    resource?: { attributes?: OtlpKeyValue[] };
    scopeSpans?: {
      spans?: {
        traceId: string;
        spanId: string;
        parentSpanId?: string;
        name: string;
        kind?: number;
        attributes?: OtlpKeyValue[];
        links?: { traceId: string; spanId: string }[];
        status?: { code?: number };
      }[];
    }[];
  }[];
}

interface Waiter {
  predicate: (spans: CollectedSpan[]) => boolean;
  resolve: (spans: CollectedSpan[]) => void;
  reject: (error: Error) => void;
  timer: NodeJS.Timeout;
}

/**
 * Starts a receiver; `close()` it in `afterAll`. `host` is the listen address, default
 * `127.0.0.1`; `0.0.0.0` lets containers reach it (the URL then still names 127.0.0.1).
 */
export async function startOtlpReceiver(host = "127.0.0.1"): Promise<OtlpReceiver> {
  const collected: CollectedSpan[] = [];
  const waiters = new Set<Waiter>();

  const settle = (waiter: Waiter, outcome: { spans: CollectedSpan[] } | { error: Error }) => {
    clearTimeout(waiter.timer);
    waiters.delete(waiter);
    if ("spans" in outcome) waiter.resolve(outcome.spans);
    else waiter.reject(outcome.error);
  };

  const notify = () => {
    for (const waiter of waiters) {
      if (waiter.predicate([...collected])) settle(waiter, { spans: [...collected] });
    }
  };

  const server = createServer((req, res) => {
    handle(req, res).catch((error: unknown) => {
      res
        .writeHead(500, { "content-type": "application/json" })
        .end(JSON.stringify({ message: String(error) }));
    });
  });

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    if (req.method !== "POST" || req.url !== "/v1/traces") {
      res.writeHead(404).end();
      return;
    }
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    let body = Buffer.concat(chunks);
    if (req.headers["content-encoding"] === "gzip") body = gunzipSync(body);
    let request: OtlpTraceRequest;
    try {
      request = JSON.parse(body.toString("utf8")) as OtlpTraceRequest;
    } catch {
      res
        .writeHead(400, { "content-type": "application/json" })
        .end(JSON.stringify({ message: "body is not JSON" }));
      return;
    }
    collected.push(...flatten(request));
    res.writeHead(200, { "content-type": "application/json" }).end("{}");
    notify();
  }

  server.listen(0, host);
  await new Promise<void>((resolve, reject) => {
    server.once("listening", resolve);
    server.once("error", reject);
  });
  const { port } = server.address() as AddressInfo;

  let closing: Promise<void> | undefined;
  return {
    url: `http://127.0.0.1:${port}`,
    spans: () => [...collected],
    waitFor: (predicate, timeoutMs = 10_000) =>
      new Promise((resolve, reject) => {
        if (closing !== undefined) {
          reject(new Error("OTLP receiver is closed"));
          return;
        }
        if (predicate([...collected])) {
          resolve([...collected]);
          return;
        }
        const waiter: Waiter = {
          predicate,
          resolve,
          reject,
          timer: setTimeout(() => {
            const names = collected.map((span) => span.name).join(", ");
            settle(waiter, {
              error: new Error(
                `OTLP receiver: condition not met within ${timeoutMs} ms; got ${collected.length} spans [${names}]`,
              ),
            });
          }, timeoutMs),
        };
        waiters.add(waiter);
      }),
    close: () =>
      (closing ??= new Promise<void>((resolve) => {
        for (const waiter of waiters) settle(waiter, { error: new Error("OTLP receiver closed") });
        // Exporters keep connections alive; without this, close() waits for them to time out.
        server.closeAllConnections();
        server.close(() => resolve());
      })),
  };
}

function flatten(request: OtlpTraceRequest): CollectedSpan[] {
  return (request.resourceSpans ?? []).flatMap((resourceSpans) => {
    const resource = toRecord(resourceSpans.resource?.attributes);
    const service =
      typeof resource["service.name"] === "string" ? resource["service.name"] : undefined;
    return (resourceSpans.scopeSpans ?? []).flatMap((scopeSpans) =>
      (scopeSpans.spans ?? []).map((span) => ({
        traceId: span.traceId,
        spanId: span.spanId,
        parentSpanId: span.parentSpanId || undefined,
        name: span.name,
        kind: span.kind ?? 0,
        service,
        attributes: toRecord(span.attributes),
        links: (span.links ?? []).map((link) => ({ traceId: link.traceId, spanId: link.spanId })),
        statusCode: span.status?.code ?? 0,
      })),
    );
  });
}

function toRecord(attributes: OtlpKeyValue[] | undefined): Record<string, unknown> {
  return Object.fromEntries((attributes ?? []).map(({ key, value }) => [key, toValue(value)]));
}

function toValue(value: OtlpAnyValue | undefined): unknown {
  if (value === undefined) return undefined;
  if (value.stringValue !== undefined) return value.stringValue;
  if (value.boolValue !== undefined) return value.boolValue;
  // OTLP JSON may encode int64 as a string; tests compare small numbers.
  if (value.intValue !== undefined) return Number(value.intValue);
  if (value.doubleValue !== undefined) return value.doubleValue;
  if (value.bytesValue !== undefined) return value.bytesValue;
  if (value.arrayValue !== undefined) return (value.arrayValue.values ?? []).map(toValue);
  if (value.kvlistValue !== undefined) return toRecord(value.kvlistValue.values);
  return undefined;
}

/**
 * Tracing for this test file as `options` ask, whatever an earlier file of the same worker left:
 * `initTelemetry` hands every later caller the process's first handle (tracing off, for a file
 * that set none), so that handle is shut down first. The caller shuts this one down.
 */
export async function freshTelemetry(options: TelemetryOptions): Promise<Telemetry> {
  await initTelemetry({ serviceName: "earlier", env: {} }).shutdown();
  return initTelemetry(options);
}
