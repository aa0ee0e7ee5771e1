export { ROLES, startActors } from "./actors.js";
export type { Role } from "./actors.js";
export { buildProgram } from "./program.js";
export {
  MESH_ACCOUNT,
  PERMISSION_ROLES,
  ownerAccount,
  passwordVariable,
  renderAccountConfig,
  renderPermissions,
  rolePermissions,
  tenantAccount,
} from "./permissions.js";
export type {
  AccountConfigOptions,
  AccountLimits,
  ExtraUser,
  PermissionOptions,
  PermissionRole,
  Permissions,
} from "./permissions.js";
