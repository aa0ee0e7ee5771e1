// Messaging semantic conventions are still "development" status upstream, so the keys are copied
// here rather than imported from `@opentelemetry/semantic-conventions/incubating`: an upstream
// rename must not silently change the attribute names our dashboards query.
// Source: https://opentelemetry.io/docs/specs/semconv/messaging/messaging-spans/

/** Attribute key naming the messaging system; always {@link MESSAGING_SYSTEM_VALUE_NATS} here. */
export const ATTR_MESSAGING_SYSTEM = "messaging.system";

/** Value of {@link ATTR_MESSAGING_SYSTEM} for every toolmesh hop. */
export const MESSAGING_SYSTEM_VALUE_NATS = "nats";

/** Attribute key for the NATS subject a message is published to or consumed from. */
export const ATTR_MESSAGING_DESTINATION_NAME = "messaging.destination.name";

/** Attribute key for the kind of messaging operation; values in {@link MessagingOperationType}. */
export const ATTR_MESSAGING_OPERATION_TYPE = "messaging.operation.type";

/** Attribute key for the message id (the `Nats-Msg-Id` header when one is set). */
export const ATTR_MESSAGING_MESSAGE_ID = "messaging.message.id";

/** Values of {@link ATTR_MESSAGING_OPERATION_TYPE} used by toolmesh. */
export const MessagingOperationType = {
  /** A producer sends a message (span kind PRODUCER). */
  Publish: "publish",
  /** A consumer pulls a message (span kind CONSUMER). */
  Receive: "receive",
  /** A consumer handles a message it received (span kind CONSUMER). */
  Process: "process",
} as const;

/** Union of the {@link MessagingOperationType} values. */
export type MessagingOperationType =
  (typeof MessagingOperationType)[keyof typeof MessagingOperationType];

/** Attribute key for the id of the tool call (OpenAI's `tool_call_id`). */
export const ATTR_TOOLMESH_CALL_ID = "toolmesh.call_id";

/** Attribute key for the name of the tool being called. */
export const ATTR_TOOLMESH_TOOL = "toolmesh.tool";

/** Attribute key for the session the call belongs to. */
export const ATTR_TOOLMESH_SESSION_ID = "toolmesh.session_id";

/** Attribute key for the delivery attempt of the call, starting at 1. */
export const ATTR_TOOLMESH_ATTEMPT = "toolmesh.attempt";
