export {
  ErrorCode,
  RetryableError,
  TerminalError,
  ToolmeshError,
  WireErrorSchema,
  ensureError,
  isRetryableByDefault,
} from "./errors.js";
export type { ToolmeshErrorOptions, WireError } from "./errors.js";
export {
  CancelReplySchema,
  CancelRequestSchema,
  CallRequestSchema,
  InputParameterSchema,
  MAX_ID_LENGTH,
  MAX_TOOL_NAME_LENGTH,
  MissingArgumentsEventSchema,
  ParamSourceSchema,
  ParamTypeSchema,
  ProgressEventSchema,
  ResolveReplySchema,
  ResolvedCallSchema,
  SessionAddressSchema,
  ToolCallSchema,
  ToolMessageSchema,
} from "./envelopes.js";
export type {
  CancelReply,
  CancelRequest,
  CallRequest,
  InputParameter,
  MissingArgumentsEvent,
  ParamSource,
  ParamType,
  ProgressEvent,
  ResolveReply,
  ResolvedCall,
  ToolCall,
  ToolMessage,
} from "./envelopes.js";
export {
  DEFAULT_SYSTEM_PARAMS,
  DEFAULT_TOOL_TIMEOUT_MS,
  RetryPolicySchema,
  ToolDefinitionSchema,
  ToolKindSchema,
  summarize,
} from "./tool-definition.js";
export type {
  RetryPolicy,
  ToolDefinition,
  ToolDefinitionInput,
  ToolKind,
} from "./tool-definition.js";
export { Header } from "./headers.js";
export {
  DEFAULT_PREFIX,
  DEFAULT_TENANT,
  MAX_TOKEN_LENGTH,
  PROTOCOL_VERSION,
  assertValidPrefix,
  createSubjects,
  subjectToken,
} from "./subjects.js";
export type { SessionAddress, SubjectOptions, Subjects } from "./subjects.js";
export { MAX_ARGUMENT_DEPTH, decodeJson, encodeJson, nestsDeeperThan } from "./codec.js";
export { wireSchemas } from "./wire-schemas.js";
export { errorToolMessage } from "./messages.js";
export type { MessageTarget } from "./messages.js";
