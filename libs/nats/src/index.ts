export {
  MIN_SERVER_VERSION,
  assertServerSupported,
  compareVersions,
  connectNats,
  failUnsentRequests,
  redactUrl,
} from "./connection.js";
export type { NatsConnectOptions } from "./connection.js";
export { followStatus } from "./status.js";
export type { StatusHandlers } from "./status.js";
export { JsApiCode, STREAM_FULL_CODES, isWrongLastSequence } from "./api-codes.js";
export { modifyKvEntry } from "./kv-modify.js";
export { watchLoaded } from "./kv-watch.js";
export type { WatchLoadedOptions } from "./kv-watch.js";
export { nextMessage, scanBucket } from "./stream-scan.js";
export type { ScannedEntry } from "./stream-scan.js";
export {
  advisoriesSpecWith,
  ensureStreams,
  ownerAdvisoriesSpec,
  ownerWorkStreamSpec,
  streamSpecs,
  storeBudget,
  STORE_SHARES,
  tenantCallsStreamSpec,
  tenantAuditStreamSpec,
} from "./streams.js";
export type { StreamLimits } from "./streams.js";
export {
  deadLetterHeaders,
  publishDurable,
  publishEphemeral,
  publishError,
  finalHeaders,
  tracedHeaders,
} from "./publish.js";
export type { DeadLetterOrigin, PublishOptions } from "./publish.js";
export { Semaphore } from "./semaphore.js";
export { answerRequest, requestFailure, rpcTenantScope, serveRequests } from "./serve-requests.js";
export type {
  RequestFailure,
  RequestKind,
  RequestServer,
  ServeRequestsOptions,
} from "./serve-requests.js";
export { requestOk, requestReply } from "./request-reply.js";
export type { RequestReplyOptions } from "./request-reply.js";
export { isNatsError } from "./nats-errors.js";
export { heartbeatMsFor, startWorkLoop } from "./work-loop.js";
export type { WorkLoop, WorkLoopOptions } from "./work-loop.js";
export { retryWhileUnavailable, unavailableKind, warnUnavailable } from "./unavailable.js";
export type { RetryWhileUnavailableOptions, UnavailableKind } from "./unavailable.js";
export { ServerClock } from "./server-clock.js";
export { ensureDurableConsumer, handBackDelayMs } from "./consumers.js";
export type { DurableConsumerOptions, StreamCompression } from "./provision.js";
export {
  ProvisionError,
  COMPRESSION_SERVER_VERSION,
  COMPRESSION_SETTING,
  REPLICAS_SETTING,
  bucketSpec,
  bucketStream,
  durableConsumerSpec,
  ensureConsumer,
  ensureStream,
  openBucket,
} from "./provision.js";
export type {
  ConsumerSpec,
  EnsureOptions,
  FieldChange,
  ProvisionChange,
  StreamSpec,
} from "./provision.js";
export {
  meshPlan,
  obsoleteStreams,
  provisionMesh,
  provisionOwnerWork,
  provisionTenantCalls,
  tenantIntakeSpec,
} from "./mesh-plan.js";
export type { MeshPlan, MeshSettings } from "./mesh-plan.js";
export {
  MESH_ACCOUNT,
  PERMISSION_ROLES,
  checkAccountId,
  ownerAccount,
  passwordVariable,
  renderAccountConfig,
  renderPermissions,
  rolePermissions,
  tenantAccount,
} from "./permissions.js";
export type {
  AccountConfigOptions,
  AccountLimits,
  ExtraUser,
  PermissionOptions,
  PermissionRole,
  Permissions,
} from "./permissions.js";
