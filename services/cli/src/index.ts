export { ROLES, startActors } from "./actors.js";
export type { Role } from "./actors.js";
export { buildProgram } from "./program.js";
export {
  PERMISSION_ROLES,
  passwordVariable,
  renderAccountConfig,
  renderPermissions,
  rolePermissions,
} from "./permissions.js";
export type {
  AccountConfigOptions,
  PermissionOptions,
  PermissionRole,
  Permissions,
} from "./permissions.js";
