// --- resolve-call.ts: pure call resolution (docs/protocol.md#what-the-resolver-checks-in-order), no NATS ---
export { findCloseMatches, parseArguments, resolveCall, validateToolName } from "./resolve-call.js";
export type { ParameterError, ResolveCallOptions } from "./resolve-call.js";
// --- end resolve-call.ts ---
export { resolveRequest, startResolver } from "./resolver.js";
export type { Resolution, Resolver, ResolverOptions } from "./resolver.js";
export { startResolverFromRuntime } from "./from-runtime.js";
