// --- control-plane.ts: what keeps the guarantees once a call is accepted ---
export { startControlPlane } from "./control-plane.js";
export type { ControlPlane, ControlPlaneOptions } from "./control-plane.js";
// --- deadline-keeper.ts: deadlines kept by watching the work stream ---
export { deadlineHeaders, finalSeen, followedResults } from "./deadline-keeper.js";
export type { FinalSeen } from "./deadline-keeper.js";
// --- dead-letters.ts: the operations behind `toolmesh dlq` ---
export { listDeadLetters, replayDeadLetter, showDeadLetter } from "./dead-letters.js";
export type {
  DeadLetter,
  DeadLetterDetail,
  ListDeadLettersOptions,
  ReplayDeadLetterOptions,
  ReplayOutcome,
} from "./dead-letters.js";
// --- purge-letters.ts: `toolmesh dlq purge`, which gives the space back ---
export { purgeDeadLetters } from "./purge-letters.js";
export type { PurgeDeadLettersOptions, PurgeOutcome } from "./purge-letters.js";
// --- owner-services.ts: what executors and bridges in an owner's account ask of the mesh ---
export { startOwnerServices } from "./owner-services.js";
export type { OwnerServices, OwnerServicesOptions } from "./owner-services.js";
