import {
  INVALID_SPAN_CONTEXT,
  SpanStatusCode,
  context,
  isSpanContextValid,
  trace,
  type Attributes,
  type Context,
  type Link,
  type Span,
  type SpanContext,
  SpanKind,
  type Tracer,
} from "@opentelemetry/api";
import { extractTraceContext } from "./propagation.js";
import {
  ATTR_ERROR_TYPE,
  ATTR_MESSAGING_DESTINATION_NAME,
  ATTR_MESSAGING_MESSAGE_ID,
  ATTR_MESSAGING_OPERATION_NAME,
  ATTR_MESSAGING_OPERATION_TYPE,
  ATTR_MESSAGING_SYSTEM,
  MESSAGING_SYSTEM_VALUE_NATS,
  MessagingOperationType,
} from "./semconv.js";

/** Options for {@link withSpan}. */
export interface WithSpanOptions {
  /** Span kind: PRODUCER for a publish, CONSUMER for receive/process, INTERNAL otherwise. */
  kind: SpanKind;
  /** Parent context, e.g. from `extractTraceContext`; default the active context. */
  parent?: Context;
  /** Attributes set at start, so samplers can see them; default none. */
  attributes?: Attributes;
  /** Spans this one follows from without being their child (an earlier attempt); default none. */
  links?: Link[];
}

/**
 * Runs `fn` inside a new span made current for its duration. If `fn` throws, the exception is
 * recorded, the span status set to ERROR and the error rethrown unchanged. The span always ends.
 * Tracing failures never reach the caller: `fn` runs even if the span cannot be created.
 */
export async function withSpan<T>(
  tracer: Tracer,
  name: string,
  options: WithSpanOptions,
  fn: (span: Span) => Promise<T>,
): Promise<T> {
  const parent = options.parent ?? context.active();
  const span = startSpanSafely(tracer, name, options, parent);
  return context.with(trace.setSpan(parent, span), async () => {
    try {
      return await fn(span);
    } catch (error) {
      ignoreFailure(() => {
        span.recordException(error instanceof Error ? error : String(error));
        span.setStatus({
          code: SpanStatusCode.ERROR,
          message: error instanceof Error ? error.message : String(error),
        });
      });
      throw error;
    } finally {
      ignoreFailure(() => span.end());
    }
  });
}

/** Trace id (32 hex chars) of the span in `ctx` (default the active context), or undefined if none. */
export function traceIdOf(ctx: Context = context.active()): string | undefined {
  const spanContext = trace.getSpanContext(ctx);
  return spanContext !== undefined && isSpanContextValid(spanContext)
    ? spanContext.traceId
    : undefined;
}

function startSpanSafely(
  tracer: Tracer,
  name: string,
  options: WithSpanOptions,
  parent: Context,
): Span {
  try {
    return tracer.startSpan(
      name,
      { kind: options.kind, attributes: options.attributes, links: options.links },
      parent,
    );
  } catch {
    // A non-recording stand-in that keeps the parent's identity, so downstream hops stay linked.
    return trace.wrapSpanContext(trace.getSpanContext(parent) ?? INVALID_SPAN_CONTEXT);
  }
}

function ignoreFailure(action: () => void): void {
  try {
    action();
  } catch {
    // Telemetry must not replace the caller's result or error with its own.
  }
}

/** What a consumer span needs from a NATS message: its subject and headers. */
export interface ConsumedMessage {
  subject: string;
  headers?: Parameters<typeof extractTraceContext>[0];
}

/**
 * Options of the span that processes one NATS message: a CONSUMER span, child of the trace
 * the message carries, with the messaging attributes and any toolmesh attributes given.
 */
export function processSpanOptions(
  msg: ConsumedMessage,
  attributes: Attributes = {},
): WithSpanOptions {
  const messageId = msg.headers?.get(NATS_MSG_ID);
  return {
    kind: SpanKind.CONSUMER,
    parent: extractTraceContext(msg.headers),
    attributes: {
      [ATTR_MESSAGING_SYSTEM]: MESSAGING_SYSTEM_VALUE_NATS,
      [ATTR_MESSAGING_OPERATION_TYPE]: MessagingOperationType.Process,
      [ATTR_MESSAGING_OPERATION_NAME]: MessagingOperationType.Process,
      [ATTR_MESSAGING_DESTINATION_NAME]: msg.subject,
      ...(messageId === undefined || messageId === ""
        ? {}
        : { [ATTR_MESSAGING_MESSAGE_ID]: messageId }),
      ...attributes,
    },
  };
}

// JetStream's deduplication header, the message's id where toolmesh sets one.
const NATS_MSG_ID = "Nats-Msg-Id";

/**
 * Marks how the operation of `span` ended when it reports failure by value rather than by
 * throwing: `error.type` and an ERROR status for a `code`, nothing for success. Never throws.
 */
export function markOutcome(span: Span, code: string | undefined, message?: string): void {
  if (code === undefined) return;
  ignoreFailure(() => {
    span.setAttribute(ATTR_ERROR_TYPE, code);
    span.setStatus({ code: SpanStatusCode.ERROR, message: message ?? code });
  });
}

/** The span context of `span` when it is a real (sampled or not) span, for links. */
export function linkableContext(span: Span): SpanContext | undefined {
  const spanContext = span.spanContext();
  return isSpanContextValid(spanContext) ? spanContext : undefined;
}
