import type { z } from "zod";
import { WireErrorSchema } from "./errors.js";
import {
  CancelReplySchema,
  CancelRequestSchema,
  CallRequestSchema,
  MissingArgumentsEventSchema,
  ProgressEventSchema,
  ResolveReplySchema,
  ResolvedCallSchema,
  ToolCallSchema,
  ToolMessageSchema,
} from "./envelopes.js";
import { ToolDefinitionSchema } from "./tool-definition.js";

/** Every wire envelope by the file name of its generated JSON Schema. */
export const wireSchemas: Readonly<Record<string, z.ZodType>> = {
  "tool-call": ToolCallSchema,
  "call-request": CallRequestSchema,
  "resolved-call": ResolvedCallSchema,
  "tool-message": ToolMessageSchema,
  "progress-event": ProgressEventSchema,
  "missing-arguments-event": MissingArgumentsEventSchema,
  "resolve-reply": ResolveReplySchema,
  "cancel-request": CancelRequestSchema,
  "cancel-reply": CancelReplySchema,
  "tool-definition": ToolDefinitionSchema,
  "wire-error": WireErrorSchema,
};
