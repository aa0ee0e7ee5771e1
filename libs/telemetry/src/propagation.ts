import {
  ROOT_CONTEXT,
  context,
  propagation,
  type Context,
  type TextMapGetter,
  type TextMapSetter,
} from "@opentelemetry/api";

/**
 * The part of NATS `MsgHdrs` (`@nats-io/nats-core` 3.x) that trace propagation needs, so this
 * package does not depend on a NATS client. `get` returns `""` for a missing key, as `MsgHdrs` does.
 */
export interface TraceHeaders {
  get(k: string): string;
  set(k: string, v: string): void;
  has?(k: string): boolean;
  keys?(): string[];
}

const setter: TextMapSetter<TraceHeaders> = {
  set: (headers, key, value) => headers.set(key, value),
};

const getter: TextMapGetter<TraceHeaders> = {
  keys: (headers) => headers.keys?.() ?? [],
  get: (headers, key) => {
    const exact = headers.get(key);
    if (exact !== "") return exact;
    // NATS header keys are case-sensitive, but producers built on HTTP header types (Go's
    // `http.Header`, for one) canonicalise `traceparent` to `Traceparent`.
    const found = headers.keys?.().find((k) => k.toLowerCase() === key);
    return found === undefined ? undefined : headers.get(found) || undefined;
  },
};

/**
 * Writes the W3C `traceparent`/`tracestate` of `ctx` (default: the active context) into NATS
 * headers. Does nothing when no propagator is registered (tracing off) or `ctx` has no span.
 */
export function injectTraceHeaders(headers: TraceHeaders, ctx: Context = context.active()): void {
  try {
    propagation.inject(ctx, headers, setter);
  } catch {
    // Invalid header values are rejected by MsgHdrs; losing the trace link beats failing the publish.
  }
}

/**
 * Reads the W3C trace context from NATS headers into a new context based on `ROOT_CONTEXT`, to use
 * as the parent of a consumer span. Returns `ROOT_CONTEXT` unchanged when headers are missing or
 * carry no valid `traceparent`.
 */
export function extractTraceContext(headers: TraceHeaders | undefined): Context {
  if (headers === undefined) return ROOT_CONTEXT;
  try {
    return propagation.extract(ROOT_CONTEXT, headers, getter);
  } catch {
    return ROOT_CONTEXT;
  }
}

/**
 * The W3C `traceparent` (and `tracestate`) of `ctx` (default: the active context) as plain fields,
 * for carriers that are not headers, such as an MCP request's `params._meta`. Empty when tracing
 * is off or there is no span.
 */
export function traceContextFields(ctx: Context = context.active()): Record<string, string> {
  const fields: Record<string, string> = {};
  try {
    propagation.inject(ctx, fields);
  } catch {
    // As for headers: a lost link beats a failed request.
  }
  return fields;
}
