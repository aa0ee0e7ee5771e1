// The control plane's parts, for tests that drive one without the whole plane.
export { deadLetter } from "./control-plane.js";
export type { ControlDeps } from "./deps.js";
export { startDeadlineKeeper } from "./deadline-keeper.js";
export type { DeadlineKeeper, DeadlineKeeperOptions, FinalSeen } from "./deadline-keeper.js";
export { reconcileOrphans } from "./reconcile.js";
export type { ReconcileOptions, ReconcileOutcome } from "./reconcile.js";
