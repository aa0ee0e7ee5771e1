// The resolver: what a process hosting it starts, and call resolution as a pure function.
export { startResolver } from "./resolver.js";
export type { Resolver, ResolverOptions } from "./resolver.js";
// --- stored-bytes.ts: what each tenant's results occupy, as `toolmesh stats` reads it ---
export { readStored } from "./stored-bytes.js";
export { startResolverFromRuntime } from "./from-runtime.js";
// --- resolve-call.ts: pure call resolution (docs/protocol.md#what-the-resolver-checks-in-order), no NATS ---
export { parseArguments, resolveCall } from "./resolve-call.js";
export type { ParameterError, ResolveCallOptions } from "./resolve-call.js";
