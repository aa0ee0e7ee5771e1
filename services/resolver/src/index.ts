// --- resolve-call.ts: pure call resolution (docs/protocol.md#what-the-resolver-checks-in-order), no NATS ---
export { findCloseMatches, parseArguments, resolveCall, validateToolName } from "./resolve-call.js";
export type { ParameterError, ResolveCallOptions } from "./resolve-call.js";
// --- end resolve-call.ts ---
export { startResolver } from "./resolver.js";
export type { Resolver, ResolverOptions } from "./resolver.js";
// --- handle-call.ts: the resolver's handlers, each taking its dependencies ---
export {
  answerDryRun,
  dryRunRequests,
  answerInvalid,
  answerKnownKey,
  answerResubmission,
  handleCall,
  resolveRequest,
  routeCall,
} from "./handle-call.js";
export type { Resolution, ResolverDeps, ToolAccessPolicy } from "./handle-call.js";
export { SessionLimits } from "./session-limits.js";
export { QuotaGate, QuotaStore, QuotaView } from "./quotas.js";
export type {
  CountedCall,
  QuotaGateOptions,
  QuotaName,
  ScopedQuota,
  UsageSummary,
} from "./quotas.js";
export { StoredBytes, readStored, storedKey } from "./stored-bytes.js";
export type { StoredBytesOptions } from "./stored-bytes.js";
export { startResolverFromRuntime } from "./from-runtime.js";
