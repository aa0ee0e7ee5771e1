import type { MsgHdrs } from "@nats-io/nats-core";
import type { ToolMessage } from "@toolmesh/protocol";
import type { SpanContext, Tracer, WithSpanOptions } from "@toolmesh/telemetry";
import {
  ATTR_ERROR_TYPE,
  ATTR_GEN_AI_TOOL_CALL_ID,
  ATTR_GEN_AI_TOOL_NAME,
  ATTR_MESSAGING_DESTINATION_NAME,
  ATTR_MESSAGING_DESTINATION_TEMPLATE,
  ATTR_MESSAGING_MESSAGE_ID,
  ATTR_MESSAGING_OPERATION_NAME,
  ATTR_MESSAGING_OPERATION_TYPE,
  ATTR_MESSAGING_SYSTEM,
  ATTR_TOOLMESH_SESSION_ID,
  MESSAGING_SYSTEM_VALUE_NATS,
  MessagingOperationType,
  SpanKind,
  extractTraceContext,
  markOutcome,
  trace,
} from "@toolmesh/telemetry";

/** Options of the producer span (`send`) of one call, child of the caller's active context. */
export function sendSpanOptions(call: {
  subject: string;
  template: string;
  messageId: string;
  tool: string;
  callId: string;
  sessionId: string;
}): WithSpanOptions {
  return {
    kind: SpanKind.PRODUCER,
    attributes: {
      [ATTR_MESSAGING_SYSTEM]: MESSAGING_SYSTEM_VALUE_NATS,
      [ATTR_MESSAGING_OPERATION_TYPE]: MessagingOperationType.Send,
      [ATTR_MESSAGING_OPERATION_NAME]: MessagingOperationType.Send,
      [ATTR_MESSAGING_DESTINATION_NAME]: call.subject,
      [ATTR_MESSAGING_DESTINATION_TEMPLATE]: call.template,
      [ATTR_MESSAGING_MESSAGE_ID]: call.messageId,
      [ATTR_GEN_AI_TOOL_NAME]: call.tool,
      [ATTR_GEN_AI_TOOL_CALL_ID]: call.callId,
      [ATTR_TOOLMESH_SESSION_ID]: call.sessionId,
    },
  };
}

/**
 * Records the frontend's receipt of a call's final message: a CONSUMER span (`receive {tool}`),
 * child of the hop that published the message (so it closes the call's trace), linked to the
 * call's `send` span, with the error code when the call failed. Never throws.
 */
export function recordReceipt(
  tracer: Tracer,
  message: ToolMessage,
  sent: SpanContext | undefined,
  headers: MsgHdrs | undefined,
): void {
  try {
    const fromMessage = extractTraceContext(headers);
    const parent =
      trace.getSpanContext(fromMessage) !== undefined || sent === undefined
        ? fromMessage
        : trace.setSpanContext(fromMessage, sent);
    const span = tracer.startSpan(
      `receive ${message.name}`,
      {
        kind: SpanKind.CONSUMER,
        attributes: {
          [ATTR_MESSAGING_SYSTEM]: MESSAGING_SYSTEM_VALUE_NATS,
          [ATTR_MESSAGING_OPERATION_TYPE]: MessagingOperationType.Receive,
          [ATTR_MESSAGING_OPERATION_NAME]: MessagingOperationType.Receive,
          [ATTR_GEN_AI_TOOL_NAME]: message.name,
          [ATTR_GEN_AI_TOOL_CALL_ID]: message.tool_call_id,
          [ATTR_TOOLMESH_SESSION_ID]: message.session_id,
          ...(message.error === undefined ? {} : { [ATTR_ERROR_TYPE]: message.error.code }),
        },
        ...(sent === undefined ? {} : { links: [{ context: sent }] }),
      },
      parent,
    );
    markOutcome(span, message.error?.code, message.error?.message);
    span.end();
  } catch {
    // Telemetry never fails a call.
  }
}
