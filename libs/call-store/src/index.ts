export {
  ANY_ARGUMENTS,
  CallRecordSchema,
  CallStateSchema,
  CallStore,
  argumentsHash,
  callRecordOf,
  knownRecordHeaders,
  knownRecordOf,
} from "./call-store.js";
export type { AcceptOutcome, CallRecord, CallRef, CallStoreOptions } from "./call-store.js";
export { openCallPlane } from "./plane.js";
export type {
  CallPlane,
  CallPlaneOptions,
  CallRecords,
  CallTarget,
  DeadLetterOut,
  MeshCallPlane,
} from "./plane.js";
export { ownerCallPlane } from "./owner-plane.js";
export type { OwnerCallPlane, OwnerPlaneOptions } from "./owner-plane.js";
