// Re-exported so services can name span kinds and contexts without depending on the API package.
export { SpanKind, trace } from "@opentelemetry/api";
export type { Context, Link, Span, SpanContext, Tracer } from "@opentelemetry/api";
export { DEFAULT_REDACT_PATHS, REDACTED, createLogger, lazyChild } from "./logger.js";
export type { Logger, LoggerOptions } from "./logger.js";
export { extractTraceContext, injectTraceHeaders, traceContextFields } from "./propagation.js";
export type { TraceHeaders } from "./propagation.js";
export {
  ATTR_ERROR_TYPE,
  ATTR_GEN_AI_OPERATION_NAME,
  ATTR_GEN_AI_TOOL_CALL_ARGUMENTS,
  ATTR_GEN_AI_TOOL_CALL_ID,
  ATTR_GEN_AI_TOOL_CALL_RESULT,
  ATTR_GEN_AI_TOOL_NAME,
  ATTR_GEN_AI_TOOL_TYPE,
  ATTR_MCP_METHOD_NAME,
  ATTR_MESSAGING_CONSUMER_GROUP_NAME,
  ATTR_MESSAGING_DELIVERY_COUNT,
  ATTR_MESSAGING_DESTINATION_NAME,
  ATTR_MESSAGING_DESTINATION_TEMPLATE,
  ATTR_MESSAGING_MESSAGE_ID,
  ATTR_MESSAGING_OPERATION_NAME,
  ATTR_MESSAGING_OPERATION_TYPE,
  ATTR_MESSAGING_SYSTEM,
  ATTR_TOOLMESH_ATTEMPT,
  ATTR_TOOLMESH_CALL_ID,
  ATTR_TOOLMESH_MCP_SERVER,
  ATTR_TOOLMESH_MCP_STATE,
  ATTR_TOOLMESH_RESOLUTION,
  ATTR_TOOLMESH_SESSION_ID,
  ATTR_TOOLMESH_TOOL,
  GEN_AI_OPERATION_EXECUTE_TOOL,
  MESSAGING_SYSTEM_VALUE_NATS,
  MessagingOperationType,
} from "./semconv.js";
export { linkableContext, markOutcome, processSpanOptions, traceIdOf, withSpan } from "./spans.js";
export type { ConsumedMessage, WithSpanOptions } from "./spans.js";
export { TelemetryConfigError, initTelemetry } from "./tracing.js";
export type { Telemetry, TelemetryEnv, TelemetryOptions } from "./tracing.js";
export { serviceNameOf } from "./otel-env.js";
export { initMetrics } from "./metrics.js";
export type { MetricPoint, MetricSnapshot, Metrics, MetricsOptions } from "./metrics.js";
export {
  ATTR_TOOLMESH_QUOTA,
  ATTR_TOOLMESH_TENANT,
  MetricName,
  ToolmeshMetrics,
  toolmeshMetrics,
} from "./instruments.js";
export type {
  McpServerReading,
  QueueReading,
  StoredReading,
  TenantReading,
} from "./instruments.js";
export {
  MAX_PAYLOAD_CHARS,
  payloadRecording,
  redactPayload,
  setPayloadRecording,
} from "./payloads.js";
