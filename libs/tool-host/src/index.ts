// --- executor.ts: serves tool modules from their work queues ---
export { credentialSources, startExecutor } from "./executor.js";
export type { Executor, ExecutorOptions } from "./executor.js";
export { ServedTools } from "./served-tools.js";
export type { SyncLog, ToolSync } from "./served-tools.js";
// --- user-secrets.ts: users' secrets for tools, sealed with AES-256-GCM ---
export { SecretBox, UserSecretStore } from "./user-secrets.js";
export { DelegatedCredentials } from "./delegation.js";
export type { Delegation } from "./delegation.js";
// --- tool-module.ts: what a tool is written against ---
export { ToolModuleSchema, defineTool } from "./tool-module.js";
export type { DefineToolOptions, ToolContext, ToolHandler, ToolModule } from "./tool-module.js";
// --- http-invoke.ts: a tool call made as an HTTP request ---
export {
  DEFAULT_ACCEPT,
  UrlAllowList,
  fillPath,
  invalidParameter,
  invokeHttp,
  setIdempotencyKey,
  textOf,
} from "./http-invoke.js";
export type { HttpEndpoint, HttpRequest } from "./http-invoke.js";
// --- http-credentials.ts: what a tool reached over HTTP acts with downstream ---
export { HttpCredentialsSchema, callerScheme, declaredCredentials } from "./http-credentials.js";
export type { HttpCredentials } from "./http-credentials.js";
// --- outbound.ts: the guard every outbound HTTP request of a tool goes through ---
export { outboundFetch, privateAddressCause, trustedHostsOf } from "./outbound.js";
export type { FetchLike, PrivateAddressAllowance } from "./outbound.js";
