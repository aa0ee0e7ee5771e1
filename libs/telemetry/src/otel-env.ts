import { parseKeyPairsIntoRecord } from "@opentelemetry/core";
import { defaultResource, resourceFromAttributes, type Resource } from "@opentelemetry/resources";
import { ATTR_SERVICE_NAME, ATTR_SERVICE_VERSION } from "@opentelemetry/semantic-conventions";

/** Environment variables as the entrypoint passes them (normally `process.env`); only `OTEL_*` keys are read. */
export type TelemetryEnv = Readonly<Record<string, string | undefined>>;

/** An `OTEL_*` variable that telemetry cannot use; `variable` names it. */
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

/**
 * The resource every signal of the process carries. The role's name is only the default:
 * `service.name` from `OTEL_RESOURCE_ATTRIBUTES`, and `OTEL_SERVICE_NAME` above it, win, as the
 * OpenTelemetry SDK specification orders them.
 */
export function resourceFor(options: {
  serviceName: string;
  serviceVersion?: string | undefined;
  env: TelemetryEnv;
}): Resource {
  const { env } = options;
  const serviceName = nonEmpty(env.OTEL_SERVICE_NAME);
  return defaultResource()
    .merge(
      resourceFromAttributes({
        [ATTR_SERVICE_NAME]: options.serviceName,
        ...(options.serviceVersion === undefined
          ? {}
          : { [ATTR_SERVICE_VERSION]: options.serviceVersion }),
      }),
    )
    .merge(resourceFromAttributes(parseKeyPairsIntoRecord(env.OTEL_RESOURCE_ATTRIBUTES)))
    .merge(
      resourceFromAttributes(serviceName === undefined ? {} : { [ATTR_SERVICE_NAME]: serviceName }),
    );
}

/** The `service.name` {@link resourceFor} settles on. */
export function serviceNameOf(options: { serviceName: string; env: TelemetryEnv }): string {
  const name = resourceFor(options).attributes[ATTR_SERVICE_NAME];
  return typeof name === "string" ? name : options.serviceName;
}

/** Whether `OTEL_SDK_DISABLED` turns every signal off. */
export function sdkDisabled(env: TelemetryEnv): boolean {
  return env.OTEL_SDK_DISABLED?.trim().toLowerCase() === "true";
}

/** The exporters named by a `OTEL_{TRACES,METRICS}_EXPORTER` variable, lower-cased. */
export function exportersOf(env: TelemetryEnv, variable: string): string[] {
  return (env[variable] ?? "")
    .split(",")
    .map((name) => name.trim().toLowerCase())
    .filter((name) => name !== "");
}

/**
 * The OTLP/HTTP URL of one signal: `OTEL_EXPORTER_OTLP_{SIGNAL}_ENDPOINT` as is, else
 * `OTEL_EXPORTER_OTLP_ENDPOINT` with `v1/{signal}` appended; undefined when neither is set.
 */
export function otlpUrl(env: TelemetryEnv, signal: "traces" | "metrics"): string | undefined {
  const variable = `OTEL_EXPORTER_OTLP_${signal.toUpperCase()}_ENDPOINT`;
  const specific = nonEmpty(env[variable]);
  if (specific !== undefined) return httpUrl(variable, specific).href;
  const general = nonEmpty(env.OTEL_EXPORTER_OTLP_ENDPOINT);
  if (general === undefined) return undefined;
  const base = httpUrl("OTEL_EXPORTER_OTLP_ENDPOINT", general);
  // Relative resolution appends to the base path only when the base ends in "/".
  return new URL(`v1/${signal}`, base.href.endsWith("/") ? base : `${base.href}/`).href;
}

/** The OTLP headers of one signal: the general ones, overridden by the signal's own. */
export function otlpHeaders(
  env: TelemetryEnv,
  signal: "traces" | "metrics",
): Record<string, string> {
  return {
    ...parseKeyPairsIntoRecord(env.OTEL_EXPORTER_OTLP_HEADERS),
    ...parseKeyPairsIntoRecord(env[`OTEL_EXPORTER_OTLP_${signal.toUpperCase()}_HEADERS`]),
  };
}

/** The OTLP export timeout of one signal, in ms; undefined for the SDK's default. */
export function otlpTimeout(env: TelemetryEnv, signal: "traces" | "metrics"): number | undefined {
  return (
    readInteger(env, `OTEL_EXPORTER_OTLP_${signal.toUpperCase()}_TIMEOUT`, 1) ??
    readInteger(env, "OTEL_EXPORTER_OTLP_TIMEOUT", 1)
  );
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
/** Throws {@link TelemetryConfigError} when the signal's OTLP protocol is gRPC. */
export function refuseGrpc(env: TelemetryEnv, signal: "traces" | "metrics"): void {
  const specific = `OTEL_EXPORTER_OTLP_${signal.toUpperCase()}_PROTOCOL`;
  const variable = nonEmpty(env[specific]) ? specific : "OTEL_EXPORTER_OTLP_PROTOCOL";
  if (nonEmpty(env[variable])?.toLowerCase() === "grpc") {
    throw new TelemetryConfigError(
      variable,
      '"http/json" or "http/protobuf": only OTLP over HTTP is supported',
    );
  }
}

/** An integer variable at least `min`, or undefined when unset; throws when malformed. */
export function readInteger(env: TelemetryEnv, variable: string, min: number): number | undefined {
  const raw = nonEmpty(env[variable]);
  if (raw === undefined) return undefined;
  const value = Number(raw);
  if (!Number.isSafeInteger(value) || value < min) {
    throw new TelemetryConfigError(variable, `an integer >= ${min}`);
  }
  return value;
}

/** The trimmed value, or undefined when unset or blank. */
export function nonEmpty(value: string | undefined): string | undefined {
  const trimmed = value?.trim();
  return trimmed === "" ? undefined : trimmed;
}
