export { Defaults } from "./defaults.js";
export {
  ErrorCode,
  RetryableError,
  TerminalError,
  ToolmeshError,
  WireErrorSchema,
  ensureError,
  isRetryableByDefault,
  malformedRequest,
  parseRequest,
  payloadTooLarge,
  requestError,
  issuesLine,
  requestIssues,
} from "./errors.js";
export type { RequestIssue, ToolmeshErrorOptions, WireError } from "./errors.js";
export {
  CancelReplySchema,
  CancelRequestSchema,
  CallRequestSchema,
  CatalogEntrySchema,
  CatalogReplySchema,
  CatalogRequestSchema,
  DescribeReplySchema,
  DescribeRequestSchema,
  ExpandReplySchema,
  ExpandRequestSchema,
  GroupStateSchema,
  GroupsReplySchema,
  GroupsRequestSchema,
  InputParameterSchema,
  MAX_ID_LENGTH,
  MAX_TOOL_NAME_LENGTH,
  MissingArgumentsEventSchema,
  OutputStrategyConfigSchema,
  ParamSourceSchema,
  ParamTypeSchema,
  ProgressEventSchema,
  AbortMessageSchema,
  RejectionSchema,
  ResolveReplySchema,
  ResolvedCallSchema,
  SchemaEventSchema,
  SchemaReasonSchema,
  SessionAddressSchema,
  ToolCallSchema,
  ToolMessageSchema,
  ToolSchemaSchema,
  idempotencyKeyOf,
} from "./envelopes.js";
export type {
  CancelReply,
  CancelRequest,
  CallRequest,
  CatalogEntry,
  CatalogReply,
  CatalogRequest,
  DescribeReply,
  DescribeRequest,
  ExpandReply,
  ExpandRequest,
  GroupState,
  GroupsReply,
  GroupsRequest,
  InputParameter,
  MissingArgumentsEvent,
  OutputStrategyConfig,
  ParamSource,
  ParamType,
  ProgressEvent,
  AbortMessage,
  Rejection,
  ResolveReply,
  ResolvedCall,
  SchemaEvent,
  SchemaReason,
  ToolCall,
  ToolMessage,
  ToolSchema,
} from "./envelopes.js";
export { ActorSchema, CallerIdentitySchema, GATEWAY_KEY_ISSUER } from "./identity.js";
export type { Actor, CallerIdentity } from "./identity.js";
export {
  RetryPolicySchema,
  ToolCredentialsSchema,
  ToolDefinitionSchema,
  ToolKindSchema,
  modelParameters,
  summarize,
  workOwnerOf,
} from "./tool-definition.js";
export type {
  RetryPolicy,
  ToolCredentials,
  ToolDefinition,
  ToolDefinitionInput,
  ToolKind,
} from "./tool-definition.js";
export { Header } from "./headers.js";
export {
  auditEventMsgId,
  callKeyOfResultMsgId,
  deadLetterMsgId,
  deliveryResultMsgId,
  finalEventMsgId,
  missingArgumentsMsgId,
  overloadedMsgId,
  refusedMsgId,
  rejectedMsgId,
  invalidResultMsgId,
  replayMsgId,
  requeueMsgId,
  resultMsgId,
  schemaMsgId,
} from "./msg-ids.js";
export {
  MAX_TOKEN_LENGTH,
  PROTOCOL_VERSION,
  STREAM_LEADER_ELECTED_ADVISORIES,
  assertValidPrefix,
  callKey,
  consumerLeaderElectedAdvisory,
  createSubjects,
  isSubjectToken,
  scopedIdempotencyKey,
  subjectToken,
} from "./subjects.js";
export type { SessionAddress, SubjectOptions, Subjects } from "./subjects.js";
export {
  MAX_ARGUMENT_DEPTH,
  contextDepthError,
  decodeJson,
  decodeJsonOrUndefined,
  encodeJson,
  encodeJsonWithMember,
  encodeWithMemberAdded,
  nestsDeeperThan,
} from "./codec.js";
export { wireSchemas } from "./wire-schemas.js";
export { CallDecisionSchema } from "./envelopes.js";
export type { CallDecision } from "./envelopes.js";
export {
  ApprovalBindingSchema,
  ApprovalDecisionSchema,
  ApprovalEntrySchema,
  ApprovalModeSchema,
  ApprovalReplySchema,
  ApprovalRequestSchema,
  ApprovalRequiredEventSchema,
  ApprovalStateSchema,
  ConfirmRequestSchema,
  PendingApprovalSchema,
} from "./approvals.js";
export type {
  ApprovalBinding,
  ApprovalDecision,
  ApprovalEntry,
  ApprovalMode,
  ApprovalReply,
  ApprovalRequest,
  ApprovalRequiredEvent,
  ApprovalState,
  ConfirmRequest,
  PendingApproval,
} from "./approvals.js";
export { QuotaSchema, parseQuota, quotaKey } from "./quotas.js";
export type { Quota, QuotaScope } from "./quotas.js";
export { MetricPointSchema, StatsReplySchema } from "./stats.js";
export type { StatsReply } from "./stats.js";
export { argumentsHash, errorToolMessage } from "./messages.js";
export type { MessageTarget } from "./messages.js";
export {
  CallRecordSchema,
  CallStateSchema,
  OWNER_SERVICES,
  OwnerAckReplySchema,
  OwnerCallSchema,
  OwnerDeadLetterRequestSchema,
  OwnerFinalizeReplySchema,
  OwnerFinalizeRequestSchema,
  OwnerProgressRequestSchema,
  OwnerRecordReplySchema,
  OwnerRecordRequestSchema,
  OwnerRegisterReplySchema,
  OwnerRegisterRequestSchema,
  OwnerUnregisterReplySchema,
  OwnerUnregisterRequestSchema,
} from "./owner.js";
export type {
  CallRecord,
  OwnerAckReply,
  OwnerDeadLetterRequest,
  OwnerFinalizeReply,
  OwnerRecordReply,
  OwnerRegisterReply,
  OwnerRegisterRequest,
  OwnerService,
  OwnerUnregisterReply,
} from "./owner.js";
export {
  MAX_PROVIDER_NAME_LENGTH,
  PROVIDER_SAFE_NAME,
  createNameMap,
  providerSafeName,
  safeToolName,
  toolNameOf,
} from "./tool-names.js";
export type { NameMap, ProviderName } from "./tool-names.js";
export { parseDurationMs, settledWithin } from "./durations.js";
export {
  DelegationDepositReplySchema,
  DelegationDepositSchema,
  requestToken,
  tokenEndpointFromEnv,
} from "./delegation.js";
export type { DelegationDeposit, TokenEndpoint, TokenResponse } from "./delegation.js";
