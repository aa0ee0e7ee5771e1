export { ROLES, startActors } from "./actors.js";
export type { Role } from "./actors.js";
export { buildProgram } from "./program.js";
