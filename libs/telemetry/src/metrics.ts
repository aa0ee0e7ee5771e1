import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { metrics } from "@opentelemetry/api";
import type { PrometheusExporter } from "@opentelemetry/exporter-prometheus";
import {
  DataPointType,
  MeterProvider,
  MetricReader,
  PeriodicExportingMetricReader,
  type IMetricReader,
} from "@opentelemetry/sdk-metrics";
import type { TelemetryEnv } from "./otel-env.js";
import {
  exportersOf,
  otlpHeaders,
  otlpTimeout,
  otlpUrl,
  readInteger,
  refuseGrpc,
  resourceFor,
  sdkDisabled,
} from "./otel-env.js";

/** Options for {@link initMetrics}. */
export interface MetricsOptions {
  /** The default `service.name` resource attribute (`OTEL_SERVICE_NAME` wins). */
  serviceName: string;
  serviceVersion?: string;
  /** Where the `OTEL_*` settings are read from. */
  env: TelemetryEnv;
  /** Port of the Prometheus scrape endpoint `/metrics` (0: any free port); none when unset. */
  prometheusPort?: number;
}

/** One data point of a {@link MetricSnapshot}; counters and gauges have `value`, histograms `histogram`. */
export interface MetricPoint {
  attributes: Record<string, string | number | boolean>;
  value?: number;
  histogram?: { boundaries: number[]; counts: number[]; sum: number; count: number };
}

/** What one instrument holds right now, cumulative since the process started. */
export interface MetricSnapshot {
  name: string;
  unit: string;
  type: "counter" | "updown" | "gauge" | "histogram";
  points: MetricPoint[];
}

/** Handle returned by {@link initMetrics}. */
export interface Metrics {
  /** Whether instruments record anything (false: `OTEL_METRICS_EXPORTER=none` or `OTEL_SDK_DISABLED=true`). */
  readonly enabled: boolean;
  /** The port `/metrics` is served on, when it is. */
  readonly prometheusPort: number | undefined;
  /** Every instrument's current values, the same numbers `/metrics` shows. Never rejects. */
  snapshot(): Promise<MetricSnapshot[]>;
  /** Exports what OTLP has not sent yet, stops the endpoint and unregisters. Never rejects. */
  shutdown(): Promise<void>;
}

const HANDLE_KEY = Symbol.for("@toolmesh/telemetry.metrics");
const registry = globalThis as { [HANDLE_KEY]?: Metrics };

/** A reader collected on demand, for `toolmesh stats`. */
class SnapshotReader extends MetricReader {
  protected override onForceFlush(): Promise<void> {
    return Promise.resolve();
  }

  protected override onShutdown(): Promise<void> {
    return Promise.resolve();
  }
}

/**
 * Sets up metrics for the process with the OpenTelemetry metrics SDK and registers the meter
 * provider globally (instruments come from {@link toolmeshMetrics}). Always kept in memory for
 * the stats subject; also served for Prometheus on `prometheusPort` at `/metrics`, and exported
 * as OTLP/HTTP JSON when `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`
 * is set (unless `OTEL_METRICS_EXPORTER` leaves `otlp` out), every `OTEL_METRIC_EXPORT_INTERVAL`
 * ms (default 60 000). Off, with no-op instruments, when `OTEL_METRICS_EXPORTER=none` or
 * `OTEL_SDK_DISABLED=true`.
 *
 * Idempotent like `initTelemetry`. Throws `TelemetryConfigError` on a malformed setting, and the
 * listen error when the port is taken.
 */
export async function initMetrics(options: MetricsOptions): Promise<Metrics> {
  const existing = registry[HANDLE_KEY];
  if (existing !== undefined) return existing;
  const { env } = options;
  const exporters = exportersOf(env, "OTEL_METRICS_EXPORTER");
  if (sdkDisabled(env) || exporters.includes("none")) {
    const off: Metrics = {
      enabled: false,
      prometheusPort: undefined,
      snapshot: () => Promise.resolve([]),
      shutdown: () => {
        if (registry[HANDLE_KEY] === off) delete registry[HANDLE_KEY];
        return Promise.resolve();
      },
    };
    registry[HANDLE_KEY] = off;
    return off;
  }

  const snapshotReader = new SnapshotReader();
  const readers: IMetricReader[] = [snapshotReader];
  const url = otlpUrl(env, "metrics");
  if (url !== undefined && (exporters.length === 0 || exporters.includes("otlp"))) {
    refuseGrpc(env, "metrics");
    const timeoutMillis = readInteger(env, "OTEL_METRIC_EXPORT_TIMEOUT", 1) ?? 30_000;
    // Loaded only when used: every service and CLI command starts faster without them.
    const { OTLPMetricExporter } = await import("@opentelemetry/exporter-metrics-otlp-http");
    readers.push(
      new PeriodicExportingMetricReader({
        exporter: new OTLPMetricExporter({
          url,
          headers: otlpHeaders(env, "metrics"),
          timeoutMillis: otlpTimeout(env, "metrics"),
        }),
        exportIntervalMillis: Math.max(
          readInteger(env, "OTEL_METRIC_EXPORT_INTERVAL", 1) ?? 60_000,
          timeoutMillis,
        ),
        exportTimeoutMillis: timeoutMillis,
      }),
    );
  }
  let prometheus: { exporter: PrometheusExporter; server: Server } | undefined;
  if (options.prometheusPort !== undefined) {
    const { PrometheusExporter } = await import("@opentelemetry/exporter-prometheus");
    const exporter = new PrometheusExporter({ preventServerStart: true });
    readers.push(exporter);
    prometheus = { exporter, server: await serveMetrics(exporter, options.prometheusPort) };
  }
  const provider = new MeterProvider({ resource: resourceFor(options), readers });
  const owns = metrics.setGlobalMeterProvider(provider);

  let stopping: Promise<void> | undefined;
  const handle: Metrics = {
    enabled: true,
    prometheusPort:
      prometheus === undefined ? undefined : (prometheus.server.address() as AddressInfo).port,
    snapshot: async () => {
      try {
        const { resourceMetrics } = await snapshotReader.collect({ timeoutMillis: 2_000 });
        return resourceMetrics.scopeMetrics.flatMap((scope) =>
          scope.metrics.map((metric) => toSnapshot(metric)),
        );
      } catch {
        return [];
      }
    },
    shutdown: () =>
      (stopping ??= (async () => {
        prometheus?.server.close();
        prometheus?.server.closeAllConnections();
        try {
          await provider.shutdown();
        } catch {
          // Metrics that could not be sent are lost; the process still exits.
        }
        if (owns) metrics.disable();
        if (registry[HANDLE_KEY] === handle) delete registry[HANDLE_KEY];
      })()),
  };
  registry[HANDLE_KEY] = handle;
  return handle;
}

async function serveMetrics(exporter: PrometheusExporter, port: number): Promise<Server> {
  const server = createServer((req, res) => {
    if (req.method === "GET" && req.url?.split("?")[0] === "/metrics") {
      exporter.getMetricsRequestHandler(req, res);
      return;
    }
    res.writeHead(404, { "content-type": "text/plain" }).end("not found\n");
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, "0.0.0.0", () => {
      server.off("error", reject);
      resolve();
    });
  });
  return server;
}

type CollectedMetric = Awaited<
  ReturnType<SnapshotReader["collect"]>
>["resourceMetrics"]["scopeMetrics"][number]["metrics"][number];

function toSnapshot(metric: CollectedMetric): MetricSnapshot {
  const { name, unit } = metric.descriptor;
  const attributesOf = (attributes: Record<string, unknown>) =>
    Object.fromEntries(
      Object.entries(attributes).filter((entry): entry is [string, string | number | boolean] =>
        ["string", "number", "boolean"].includes(typeof entry[1]),
      ),
    );
  if (metric.dataPointType === DataPointType.HISTOGRAM) {
    return {
      name,
      unit,
      type: "histogram",
      points: metric.dataPoints.map((point) => ({
        attributes: attributesOf(point.attributes),
        histogram: {
          boundaries: point.value.buckets.boundaries,
          counts: point.value.buckets.counts,
          sum: point.value.sum ?? 0,
          count: point.value.count,
        },
      })),
    };
  }
  if (metric.dataPointType === DataPointType.SUM || metric.dataPointType === DataPointType.GAUGE) {
    return {
      name,
      unit,
      type:
        metric.dataPointType === DataPointType.GAUGE
          ? "gauge"
          : metric.isMonotonic
            ? "counter"
            : "updown",
      points: metric.dataPoints.map((point) => ({
        attributes: attributesOf(point.attributes),
        value: point.value,
      })),
    };
  }
  return { name, unit, type: "gauge", points: [] };
}
