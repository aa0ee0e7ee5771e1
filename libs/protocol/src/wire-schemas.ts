import type { z } from "zod";
import { WireErrorSchema } from "./errors.js";
import {
  AbortMessageSchema,
  CancelReplySchema,
  CancelRequestSchema,
  CallRequestSchema,
  CatalogReplySchema,
  CatalogRequestSchema,
  DescribeReplySchema,
  DescribeRequestSchema,
  ExpandReplySchema,
  ExpandRequestSchema,
  GroupsReplySchema,
  GroupsRequestSchema,
  MissingArgumentsEventSchema,
  ProgressEventSchema,
  RejectionSchema,
  ResolveReplySchema,
  ResolvedCallSchema,
  SchemaEventSchema,
  ToolCallSchema,
  ToolMessageSchema,
} from "./envelopes.js";
import { QuotaSchema } from "./quotas.js";
import { StatsReplySchema } from "./stats.js";
import { ToolDefinitionSchema } from "./tool-definition.js";

/** Every wire envelope by the file name of its generated JSON Schema. */
export const wireSchemas: Readonly<Record<string, z.ZodType>> = {
  "tool-call": ToolCallSchema,
  "call-request": CallRequestSchema,
  "resolved-call": ResolvedCallSchema,
  "tool-message": ToolMessageSchema,
  rejection: RejectionSchema,
  "abort-message": AbortMessageSchema,
  "progress-event": ProgressEventSchema,
  "missing-arguments-event": MissingArgumentsEventSchema,
  "resolve-reply": ResolveReplySchema,
  "cancel-request": CancelRequestSchema,
  "cancel-reply": CancelReplySchema,
  "schema-event": SchemaEventSchema,
  "catalog-request": CatalogRequestSchema,
  "catalog-reply": CatalogReplySchema,
  "describe-request": DescribeRequestSchema,
  "describe-reply": DescribeReplySchema,
  "expand-request": ExpandRequestSchema,
  "expand-reply": ExpandReplySchema,
  "groups-request": GroupsRequestSchema,
  "groups-reply": GroupsReplySchema,
  "tool-definition": ToolDefinitionSchema,
  "wire-error": WireErrorSchema,
  "stats-reply": StatsReplySchema,
  quota: QuotaSchema,
};
