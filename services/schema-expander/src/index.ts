export { SCHEMA_EXPANDER_QUEUE, startSchemaExpander } from "./schema-expander.js";
export type { SchemaExpander, SchemaExpanderOptions } from "./schema-expander.js";
export { startSchemaExpanderFromRuntime } from "./from-runtime.js";
