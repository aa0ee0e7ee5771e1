// --- control-plane.ts: what keeps the guarantees once a call is accepted ---
export {
  answerCancel,
  cancelRequests,
  cancelCall,
  deadLetter,
  onMaxDeliveries,
  startControlPlane,
} from "./control-plane.js";
export type { ControlPlane, ControlPlaneOptions } from "./control-plane.js";
export type { ControlDeps } from "./deps.js";
// --- deadline-keeper.ts: deadlines kept by watching the work stream ---
export { deadlineHeaders, startDeadlineKeeper } from "./deadline-keeper.js";
export type { DeadlineKeeper, DeadlineKeeperOptions } from "./deadline-keeper.js";
// --- dead-letters.ts: the operations behind `toolmesh dlq` ---
export { listDeadLetters, replayDeadLetter, showDeadLetter } from "./dead-letters.js";
export type {
  DeadLetter,
  DeadLetterDetail,
  ListDeadLettersOptions,
  ReplayDeadLetterOptions,
  ReplayOutcome,
} from "./dead-letters.js";
// --- reconcile.ts: orphaned work-queue messages after a server restart ---
export { reconcileOrphans } from "./reconcile.js";
export type { ReconcileOptions, ReconcileOutcome } from "./reconcile.js";
// --- owner-services.ts: what executors and bridges in an owner's account ask of the mesh ---
export { answerOwner, startOwnerServices } from "./owner-services.js";
export type { OwnerServices, OwnerServicesOptions } from "./owner-services.js";
