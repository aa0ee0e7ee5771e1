export { AccessView } from "./access-view.js";
export type { AccessViewLog, AccessViewOptions } from "./access-view.js";
export { buildCatalog, findAgent } from "./catalog.js";
export { withProviderSafeNames } from "./safe-names.js";
export type { BuiltCatalog, CatalogInput } from "./catalog.js";
export {
  AgentConfigSchema,
  EMPTY_CATALOG_CONFIG,
  ToolSetConfigSchema,
  buildCatalogConfig,
  loadCatalogConfig,
  logConfigWarnings,
  unknownToolReferences,
} from "./config.js";
export type {
  AgentConfig,
  AgentProfile,
  CatalogConfig,
  ConfigSource,
  ConfigWarning,
  ConfigWarningLog,
  LoadCatalogConfigOptions,
  ToolSetConfig,
  ToolSetProfile,
  UnknownToolReference,
} from "./config.js";
export { CatalogConfigError, CatalogConfigProblem } from "./errors.js";
export {
  checkToolAccess,
  describeGroups,
  effectiveAgent,
  groupActivity,
  toolEnabled,
} from "./policy.js";
export type { AccessContext, GroupSwitches, SessionPolicy } from "./policy.js";
export {
  MAX_SUMMARY_LENGTH,
  compactCatalogEntry,
  compactLine,
  expandedCatalogEntry,
  modelSchema,
} from "./schema.js";
export type { RevisedTool } from "./schema.js";
export { StateStore, decodePolicy, decodeSchemas, decodeTenantGroups } from "./state.js";
export type {
  Revised,
  SessionPolicyState,
  SessionSchemasState,
  StateStoreOptions,
  TenantGroupsState,
  UpdateOutcome,
} from "./state.js";
export { QuotaStore } from "./quota-store.js";
export type { ScopedQuota, UsageSummary } from "./quota-store.js";
