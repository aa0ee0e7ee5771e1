export { Session, ToolmeshClient } from "./client.js";
export type {
  CallHandle,
  CallInput,
  ClientOptions,
  SessionEvent,
  SubmitOptions,
} from "./client.js";
