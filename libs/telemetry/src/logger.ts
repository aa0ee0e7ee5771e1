import { isSpanContextValid, trace } from "@opentelemetry/api";
import { pino, type DestinationStream, type Level, type Logger } from "pino";

export type { Logger };

/**
 * Paths always redacted by {@link createLogger}: credentials, and the values of preset tool
 * parameters, which operators configure and the model must never see echoed back in logs.
 * `*` matches one level of nesting (pino `redact` path syntax).
 */
export const DEFAULT_REDACT_PATHS: readonly string[] = [
  "*.password",
  "*.token",
  "*.apiKey",
  "*.api_key",
  "*.authorization",
  "*.headers.authorization",
  "presets",
  "*.presets",
  "preset_values",
  "*.preset_values",
  "secret",
  "*.secret",
];

/** Replacement written in place of every redacted value. */
export const REDACTED = "[redacted]";

/** Options for {@link createLogger}. */
export interface LoggerOptions {
  /** Service name written as `service` on every line. */
  service: string;
  /** Minimum level written; default `"info"`. */
  level?: Level | "silent";
  /**
   * Accepted so entrypoints can pass a dev flag, but has no effect: output is always JSON.
   * For human-readable logs pipe the process through `pino-pretty`. Default `false`.
   */
  pretty?: boolean;
  /** Extra pino `redact` paths, added to {@link DEFAULT_REDACT_PATHS}. Default none. */
  redact?: readonly string[];
  /** Where lines are written; default stdout. */
  destination?: DestinationStream;
}

/**
 * Creates the process's root pino logger: JSON lines with `service`, an ISO `time`, secrets and
 * preset values redacted, and `trace_id`/`span_id` of the active OpenTelemetry span when there is one.
 */
export function createLogger(options: LoggerOptions): Logger {
  return pino(
    {
      level: options.level ?? "info",
      base: { service: options.service },
      timestamp: pino.stdTimeFunctions.isoTime,
      redact: { paths: [...DEFAULT_REDACT_PATHS, ...(options.redact ?? [])], censor: REDACTED },
      mixin: activeSpanFields,
    },
    options.destination,
  );
}

const LEVELS: ReadonlySet<string> = new Set(["trace", "debug", "info", "warn", "error", "fatal"]);
const noop = (): void => undefined;

/**
 * A child of `log` with `bindings`, made only once something is logged through it. A call's
 * logger is made for every call and used by few: a pino child serializes (and redacts) its
 * bindings when it is made. A level `log` does not write costs nothing.
 */
export function lazyChild(log: Logger, bindings: Record<string, unknown>): Logger {
  let child: Logger | undefined;
  const made = (): Logger => (child ??= log.child(bindings));
  return new Proxy(log, {
    get(_target, prop) {
      // Until it is made, the child writes what its parent writes.
      if (typeof prop === "string" && LEVELS.has(prop) && !(child ?? log).isLevelEnabled(prop))
        return noop;
      const target = made();
      const value: unknown = Reflect.get(target, prop, target);
      return typeof value === "function"
        ? (value as (...args: unknown[]) => unknown).bind(target)
        : value;
    },
    // What is set (a tool raising its logger's level) is the child's, never the parent's.
    set(_target, prop, value) {
      const target = made();
      return Reflect.set(target, prop, value, target);
    },
  });
}

// Returns a fresh object every time: pino's default merge strategy `Object.assign`s the log line
// into it, so a shared constant would leak fields between lines.
function activeSpanFields(): Record<string, string> {
  const spanContext = trace.getActiveSpan()?.spanContext();
  if (spanContext === undefined || !isSpanContextValid(spanContext)) return {};
  return { trace_id: spanContext.traceId, span_id: spanContext.spanId };
}
