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
  /** A producer sends a message (span kind PRODUCER); the older name of `send`. */
  Publish: "publish",
  /** A producer sends a message (span kind PRODUCER). */
  Send: "send",
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

/** Attribute key for the operation name as the messaging system calls it (`send`, `process`). */
export const ATTR_MESSAGING_OPERATION_NAME = "messaging.operation.name";

/** Attribute key for the durable consumer a message is processed through. */
export const ATTR_MESSAGING_CONSUMER_GROUP_NAME = "messaging.consumer.group.name";

/** Attribute key for the low-cardinality template of a destination (`toolmesh.v1.calls.{tenant}.{session}`). */
export const ATTR_MESSAGING_DESTINATION_TEMPLATE = "messaging.destination.template";

/** Attribute key for the delivery count of a message consumed from JetStream. */
export const ATTR_MESSAGING_DELIVERY_COUNT = "messaging.nats.delivery_count";

// GenAI semantic conventions are "development" status upstream as well, copied for the same
// reason. Source: https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/#execute-tool-span

/** Attribute key for the GenAI operation; {@link GEN_AI_OPERATION_EXECUTE_TOOL} on a tool's span. */
export const ATTR_GEN_AI_OPERATION_NAME = "gen_ai.operation.name";

/** Value of {@link ATTR_GEN_AI_OPERATION_NAME} on the span that runs a tool. */
export const GEN_AI_OPERATION_EXECUTE_TOOL = "execute_tool";

/** Attribute key for the name of the tool the model called. */
export const ATTR_GEN_AI_TOOL_NAME = "gen_ai.tool.name";

/** Attribute key for the model's id of the tool call (OpenAI's `tool_call_id`). */
export const ATTR_GEN_AI_TOOL_CALL_ID = "gen_ai.tool.call.id";

/** Attribute key for the kind of tool: `function` (builtin, native HTTP) or `extension` (MCP). */
export const ATTR_GEN_AI_TOOL_TYPE = "gen_ai.tool.type";

/** Attribute key for the tool's arguments; recorded only when payload recording is on, redacted. */
export const ATTR_GEN_AI_TOOL_CALL_ARGUMENTS = "gen_ai.tool.call.arguments";

/** Attribute key for the tool's result; recorded only when payload recording is on, redacted. */
export const ATTR_GEN_AI_TOOL_CALL_RESULT = "gen_ai.tool.call.result";

/** Attribute key for the class of error an operation ended with (a toolmesh error code). Stable. */
export const ATTR_ERROR_TYPE = "error.type";

// MCP semantic conventions (development status).
// Source: https://opentelemetry.io/docs/specs/semconv/gen-ai/mcp/

/** Attribute key for the JSON-RPC method of an MCP request (`tools/call`). */
export const ATTR_MCP_METHOD_NAME = "mcp.method.name";

/** Attribute key naming the MCP server (the bridge's name for it) a request went to. */
export const ATTR_TOOLMESH_MCP_SERVER = "toolmesh.mcp.server";

/** Attribute key for the state of an MCP server connection (`ready`, `connecting`, …). */
export const ATTR_TOOLMESH_MCP_STATE = "toolmesh.mcp.state";

/** Attribute key for how a resolver ended a call: `resolved` or `rejected`. */
export const ATTR_TOOLMESH_RESOLUTION = "toolmesh.resolution";
