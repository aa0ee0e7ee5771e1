export {
  ANY_ARGUMENTS,
  CallRecordSchema,
  CallStateSchema,
  CallStore,
  callRecordOf,
  knownRecordHeaders,
  knownRecordOf,
  stampArguments,
} from "./call-store.js";
/** Kept here too: the call store is where arguments are compared. */
export { argumentsHash } from "@toolmesh/protocol";
export type {
  AcceptOutcome,
  CallRecord,
  CallRef,
  CallStoreOptions,
  DatedRecord,
} from "./call-store.js";
export { openCallPlane } from "./plane.js";
export type {
  CallPlane,
  CallPlaneOptions,
  CallRecords,
  CallTarget,
  DeadLetterOut,
  MeshCallPlane,
} from "./plane.js";
export { OwnerCallPlane, ownerCallPlane } from "./owner-plane.js";
export type { OwnerPlaneOptions } from "./owner-plane.js";
export { ApprovalsAtRest } from "./approvals-at-rest.js";
export type { WaitingApproval } from "./approvals-at-rest.js";
