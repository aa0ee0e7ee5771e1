import { context, propagation, trace, type Tracer } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { W3CTraceContextPropagator, parseKeyPairsIntoRecord } from "@opentelemetry/core";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-http";
import { defaultResource, resourceFromAttributes } from "@opentelemetry/resources";
import {
  BasicTracerProvider,
  BatchSpanProcessor,
  type BufferConfig,
} from "@opentelemetry/sdk-trace-base";
import { ATTR_SERVICE_NAME, ATTR_SERVICE_VERSION } from "@opentelemetry/semantic-conventions";

/** Environment variables as the entrypoint passes them (normally `process.env`); only `OTEL_*` keys are read. */
export type TelemetryEnv = Readonly<Record<string, string | undefined>>;

/** Options for {@link initTelemetry}. */
export interface TelemetryOptions {
  /** The `service.name` resource attribute, also used as the tracer name. */
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

/** An `OTEL_*` variable that {@link initTelemetry} cannot use; `variable` names it. */
export class TelemetryConfigError extends Error {
  override readonly name = "TelemetryConfigError";

  constructor(
    /** The offending environment variable. */
    readonly variable: string,
    expected: string,
  ) {
    // The value is left out on purpose: endpoints and headers can carry credentials.
    super(`${variable} is invalid: expected ${expected}`);
  }
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
 * `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`, `OTEL_RESOURCE_ATTRIBUTES`. Settings not listed (sampler, span
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
  const endpoint =
    nonEmpty(env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) ?? nonEmpty(env.OTEL_EXPORTER_OTLP_ENDPOINT);
  if (endpoint === undefined) return false;
  if (env.OTEL_SDK_DISABLED?.trim().toLowerCase() === "true") return false;
  const exporters = (env.OTEL_TRACES_EXPORTER ?? "")
    .split(",")
    .map((name) => name.trim().toLowerCase());
  return !exporters.includes("none");
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
  refuseGrpc(env);
  const headers = {
    ...parseKeyPairsIntoRecord(env.OTEL_EXPORTER_OTLP_HEADERS),
    ...parseKeyPairsIntoRecord(env.OTEL_EXPORTER_OTLP_TRACES_HEADERS),
  };
  // The exporter and the batch processor would read these from process.env, not from `env`.
  const exporter = new OTLPTraceExporter({
    url: tracesUrl(env),
    headers,
    timeoutMillis:
      readInteger(env, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", 1) ??
      readInteger(env, "OTEL_EXPORTER_OTLP_TIMEOUT", 1),
  });
  const batching: BufferConfig = {
    scheduledDelayMillis: readInteger(env, "OTEL_BSP_SCHEDULE_DELAY", 0),
    exportTimeoutMillis: readInteger(env, "OTEL_BSP_EXPORT_TIMEOUT", 1),
    maxQueueSize: readInteger(env, "OTEL_BSP_MAX_QUEUE_SIZE", 1),
    maxExportBatchSize: readInteger(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 1),
  };
  const provider = new BasicTracerProvider({
    resource: defaultResource()
      .merge(resourceFromAttributes(parseKeyPairsIntoRecord(env.OTEL_RESOURCE_ATTRIBUTES)))
      .merge(
        resourceFromAttributes({
          [ATTR_SERVICE_NAME]: options.serviceName,
          ...(options.serviceVersion === undefined
            ? {}
            : { [ATTR_SERVICE_VERSION]: options.serviceVersion }),
        }),
      ),
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

function tracesUrl(env: TelemetryEnv): string {
  const specific = nonEmpty(env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT);
  if (specific !== undefined) return httpUrl("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", specific).href;
  const base = httpUrl(
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    nonEmpty(env.OTEL_EXPORTER_OTLP_ENDPOINT) ?? "",
  );
  // Relative resolution appends to the base path only when the base ends in "/".
  return new URL("v1/traces", base.href.endsWith("/") ? base : `${base.href}/`).href;
}

function httpUrl(variable: string, value: string): URL {
  const url = URL.canParse(value) ? new URL(value) : undefined;
  if (url === undefined || (url.protocol !== "http:" && url.protocol !== "https:")) {
    throw new TelemetryConfigError(variable, "an http:// or https:// URL");
  }
  return url;
}

// Collectors accept JSON wherever they accept OTLP/HTTP protobuf, but a gRPC endpoint would
// silently drop every batch, so that mismatch is refused at startup.
function refuseGrpc(env: TelemetryEnv): void {
  const variable = nonEmpty(env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL)
    ? "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
    : "OTEL_EXPORTER_OTLP_PROTOCOL";
  if (nonEmpty(env[variable])?.toLowerCase() === "grpc") {
    throw new TelemetryConfigError(
      variable,
      '"http/json" or "http/protobuf": only OTLP over HTTP is supported',
    );
  }
}

function readInteger(env: TelemetryEnv, variable: string, min: number): number | undefined {
  const raw = nonEmpty(env[variable]);
  if (raw === undefined) return undefined;
  const value = Number(raw);
  if (!Number.isSafeInteger(value) || value < min) {
    throw new TelemetryConfigError(variable, `an integer >= ${min}`);
  }
  return value;
}

function nonEmpty(value: string | undefined): string | undefined {
  const trimmed = value?.trim();
  return trimmed === "" ? undefined : trimmed;
}
