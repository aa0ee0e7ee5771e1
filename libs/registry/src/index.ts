// --- compile.ts: tool definitions compiled once for resolving calls ---
export { compileTool, paramTypeOf } from "./compile.js";
export type {
  CompiledParam,
  CompiledTool,
  ErrorObject,
  JsonSchema,
  ValidateFunction,
} from "./compile.js";
// --- end compile.ts ---
export { ToolNameCollisionError, ToolRegistry } from "./registry.js";
export type {
  RegisterOutcome,
  RegistryListener,
  RegistryLog,
  RegistryOptions,
} from "./registry.js";
export { DEFAULT_REGISTRATION_LIMITS, checkOwnerRoom, checkToolSize } from "./limits.js";
export type { RegistrationLimits } from "./limits.js";
export { CAPACITY_PERIOD_MS, CapacityAnnouncer, ToolCapacity, parseCapacity } from "./capacity.js";
export type {
  CapacityAnnouncement,
  CapacityAnnouncerOptions,
  CapacityLog,
  ToolCapacityOptions,
} from "./capacity.js";
