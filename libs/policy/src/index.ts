export { PolicyDecider } from "./decider.js";
export type { PolicyDecision, PolicyRequest, PolicyScope, ResolvedCallFacts } from "./decider.js";
export {
  CompiledPolicySet,
  DEFAULT_APPROVAL_TTL_MS,
  PolicySetError,
  approvalTtlMs,
} from "./policy-set.js";
export type { ApprovalRule, CedarRequest, PolicyProblem, SetVerdict } from "./policy-set.js";
export {
  CEDAR_SCHEMA,
  NAMESPACE,
  actionUid,
  cedarValue,
  tenantUid,
  toolEntity,
  toolKindOf,
  toolUid,
} from "./schema.js";
export type { PolicyAction } from "./schema.js";
export { PolicyStore, PolicyView, openPolicyBucket, policyKey } from "./store.js";
export type { PolicyViewLog, StoredPolicySet } from "./store.js";
