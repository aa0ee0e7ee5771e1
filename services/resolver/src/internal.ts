// The resolver's handlers, each taking its dependencies: for tests that drive one handler.
export { handleCall, resolveRequest, routeCall } from "./handle-call.js";
export type { ResolverDeps } from "./handle-call.js";
export { SessionLimits } from "./session-limits.js";
