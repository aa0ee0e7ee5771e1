export {
  CallRecordSchema,
  CallStateSchema,
  CallStore,
  argumentsHash,
  finalizeCall,
} from "./call-store.js";
export type { AcceptOutcome, CallRecord, CallStoreOptions, PublishFinal } from "./call-store.js";
