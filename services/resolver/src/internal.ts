// The resolver's handlers, each taking its dependencies: for tests that drive one handler.
export { handleCall, resolveRequest, routeCall } from "./handle-call.js";
export { routedUnderRecord } from "./routed-before.js";
export type { ResolverDeps } from "./handle-call.js";
export { SessionLimits } from "./session-limits.js";
export { Admission, AdmissionTicket, admissionId } from "./admission.js";
export { StoredBytes } from "./stored-bytes.js";
export type { AdmissionCall, AdmissionOptions, AdmissionVerdict } from "./admission.js";
