// Re-exported so services can name span kinds and contexts without depending on the API package.
export { SpanKind } from "@opentelemetry/api";
export type { Context, Span, Tracer } from "@opentelemetry/api";
export { DEFAULT_REDACT_PATHS, REDACTED, createLogger } from "./logger.js";
export type { Logger, LoggerOptions } from "./logger.js";
export { extractTraceContext, injectTraceHeaders } from "./propagation.js";
export type { TraceHeaders } from "./propagation.js";
export {
  ATTR_MESSAGING_DESTINATION_NAME,
  ATTR_MESSAGING_MESSAGE_ID,
  ATTR_MESSAGING_OPERATION_TYPE,
  ATTR_MESSAGING_SYSTEM,
  ATTR_TOOLMESH_ATTEMPT,
  ATTR_TOOLMESH_CALL_ID,
  ATTR_TOOLMESH_SESSION_ID,
  ATTR_TOOLMESH_TOOL,
  MESSAGING_SYSTEM_VALUE_NATS,
  MessagingOperationType,
} from "./semconv.js";
export { processSpanOptions, traceIdOf, withSpan } from "./spans.js";
export type { ConsumedMessage, WithSpanOptions } from "./spans.js";
export { TelemetryConfigError, initTelemetry } from "./tracing.js";
export type { Telemetry, TelemetryEnv, TelemetryOptions } from "./tracing.js";
