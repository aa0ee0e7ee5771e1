import { context, propagation, trace, type Tracer } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-http";
import {
  BasicTracerProvider,
  BatchSpanProcessor,
  type BufferConfig,
} from "@opentelemetry/sdk-trace-base";
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

/** Options for {@link initTelemetry}. */
export interface TelemetryOptions {
  /**
   * The default `service.name` resource attribute (`OTEL_SERVICE_NAME` wins), also the tracer name.
   */
  serviceName: string;
  /** The `service.version` resource attribute; default none. */
  serviceVersion?: string;
  /** Where the `OTEL_*` settings are read from; this package never reads `process.env` itself. */
  env: TelemetryEnv;
}

/** Handle returned by {@link initTelemetry}. */
export interface Telemetry {
  /** Whether spans are exported. */
  readonly enabled: boolean;
  /**
   * The service's tracer. When tracing is off, the API's global tracer: a no-op unless the app
   * registered a provider of its own.
   */
  readonly tracer: Tracer;
  /** Exports buffered spans now. Never rejects. */
  forceFlush(): Promise<void>;
  /**
   * Flushes, stops exporting and unregisters what {@link initTelemetry} registered globally, so a
   * later call starts afresh. Process-wide: call it once, at exit. Never rejects; repeat calls
   * return the first call's promise.
   */
  shutdown(): Promise<void>;
}

// Kept on globalThis rather than in a module variable because the package can be loaded twice in
// one process (from dist/ and, under the `@toolmesh/source` condition, from src/), while the
// OpenTelemetry globals it registers exist once per process.
const HANDLE_KEY = Symbol.for("@toolmesh/telemetry.handle");
const registry = globalThis as { [HANDLE_KEY]?: Telemetry };

/**
 * Sets up tracing for the process. Tracing is on when `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used
 * as is) or `OTEL_EXPORTER_OTLP_ENDPOINT` (`/v1/traces` appended) is set, unless
 * `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`. Spans go in batches as OTLP/HTTP JSON;
 * the W3C trace-context propagator and an AsyncLocalStorage context manager are registered globally.
 *
 * Also read from `env`: `OTEL_EXPORTER_OTLP[_TRACES]_HEADERS`,
 * `OTEL_EXPORTER_OTLP[_TRACES]_TIMEOUT` (ms), `OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL` (`grpc` is
 * refused), `OTEL_BSP_SCHEDULE_DELAY` and `OTEL_BSP_EXPORT_TIMEOUT` (ms), `OTEL_BSP_MAX_QUEUE_SIZE`,
 * `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`, `OTEL_RESOURCE_ATTRIBUTES` and `OTEL_SERVICE_NAME` (both win over
 * `serviceName`, which is only the default). Settings not listed (sampler, span
 * limits, TLS files, compression) are read by the OpenTelemetry SDK from `process.env` directly.
 *
 * Idempotent: later calls return the first call's handle and ignore their options, so several
 * actors can share a process. Throws {@link TelemetryConfigError} on a malformed setting, so a
 * typo fails at startup instead of silently losing every span; never throws once running.
 */
export function initTelemetry(options: TelemetryOptions): Telemetry {
  const existing = registry[HANDLE_KEY];
  if (existing !== undefined) return existing;
  const handle = tracingEnabled(options.env) ? startTracing(options) : tracingOff(options);
  registry[HANDLE_KEY] = handle;
  return handle;
}

function tracingEnabled(env: TelemetryEnv): boolean {
  if (otlpUrl(env, "traces") === undefined || sdkDisabled(env)) return false;
  return !exportersOf(env, "OTEL_TRACES_EXPORTER").includes("none");
}

function tracingOff(options: TelemetryOptions): Telemetry {
  const handle: Telemetry = {
    enabled: false,
    tracer: trace.getTracer(options.serviceName, options.serviceVersion),
    forceFlush: () => Promise.resolve(),
    shutdown: () => {
      if (registry[HANDLE_KEY] === handle) delete registry[HANDLE_KEY];
      return Promise.resolve();
    },
  };
  return handle;
}

function startTracing(options: TelemetryOptions): Telemetry {
  const { env } = options;
  refuseGrpc(env, "traces");
  // The exporter and the batch processor would read these from process.env, not from `env`.
  const exporter = new OTLPTraceExporter({
    url: otlpUrl(env, "traces"),
    headers: otlpHeaders(env, "traces"),
    timeoutMillis: otlpTimeout(env, "traces"),
  });
  const batching: BufferConfig = {
    scheduledDelayMillis: readInteger(env, "OTEL_BSP_SCHEDULE_DELAY", 0),
    exportTimeoutMillis: readInteger(env, "OTEL_BSP_EXPORT_TIMEOUT", 1),
    maxQueueSize: readInteger(env, "OTEL_BSP_MAX_QUEUE_SIZE", 1),
    maxExportBatchSize: readInteger(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 1),
  };
  const provider = new BasicTracerProvider({
    resource: resourceFor(options),
    spanProcessors: [new BatchSpanProcessor(exporter, batching)],
  });

  // Each set* returns false when something else already registered that global; such a global is
  // left alone at shutdown.
  const contextManager = new AsyncLocalStorageContextManager().enable();
  const ownsContext = context.setGlobalContextManager(contextManager);
  const ownsPropagator = propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  const ownsProvider = trace.setGlobalTracerProvider(provider);

  let stopping: Promise<void> | undefined;
  const handle: Telemetry = {
    enabled: true,
    tracer: provider.getTracer(options.serviceName, options.serviceVersion),
    forceFlush: async () => {
      try {
        await provider.forceFlush();
      } catch {
        // Export failures are reported through the OpenTelemetry diag logger, not to the caller.
      }
    },
    shutdown: () =>
      (stopping ??= (async () => {
        try {
          await provider.shutdown();
        } catch {
          // As for forceFlush: spans that could not be sent are lost, the process still exits.
        }
        if (ownsProvider) trace.disable();
        if (ownsPropagator) propagation.disable();
        if (ownsContext) context.disable();
        else contextManager.disable();
        if (registry[HANDLE_KEY] === handle) delete registry[HANDLE_KEY];
      })()),
  };
  return handle;
}

export { TelemetryConfigError } from "./otel-env.js";
export type { TelemetryEnv } from "./otel-env.js";
