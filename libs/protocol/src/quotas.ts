import { z } from "zod";
import { ErrorCode, ToolmeshError } from "./errors.js";
import { subjectToken } from "./subjects.js";

/**
 * The limits of one quota scope (a tenant, a tenant × tool, or a tenant × agent), as stored in
 * the quotas bucket. Every field is optional; an absent field does not limit.
 */
export const QuotaSchema = z
  .object({
    /** Calls accepted and not yet ended (waiting or running). */
    max_in_flight: z.number().int().min(1).optional(),
    /** Calls waiting for their fair turn at the resolvers while the tool is busy. */
    max_queued: z.number().int().min(0).optional(),
    /** Calls per second, refilled continuously (a token bucket). */
    rate: z.number().positive().optional(),
    /** Calls that may arrive at once after a quiet spell; default `ceil(rate)`. */
    burst: z.number().int().min(1).optional(),
    /** Calls per UTC day. */
    daily: z.number().int().min(1).optional(),
    /** Share of a busy tool's capacity relative to other tenants (tenant scope only); default 1. */
    weight: z.number().positive().max(1_000).optional(),
    /**
     * Bytes of final messages the tenant's calls may have stored within the retention (tenant
     * scope only); default `TOOLMESH_TENANT_MAX_STORED_BYTES`.
     */
    max_stored_bytes: z.number().int().min(1).optional(),
  })
  .strict()
  .meta({ id: "Quota", description: "The limits of one quota scope; absent fields do not limit." });

/** The limits of one quota scope. */
export type Quota = z.infer<typeof QuotaSchema>;

/** What a quota applies to: a tenant, optionally narrowed to one tool or one agent. */
export interface QuotaScope {
  readonly tenant: string;
  readonly tool?: string | undefined;
  readonly agent?: string | undefined;
}

/**
 * Key of a scope in the quotas bucket (and the usage bucket): `{tenant}`, `{tenant}.tool.{tool}`
 * or `{tenant}.agent.{agent}`, each id mapped by `subjectToken`.
 */
export function quotaKey(scope: QuotaScope): string {
  if (scope.tool !== undefined && scope.agent !== undefined) {
    throw new ToolmeshError(
      ErrorCode.InvalidRequest,
      "a quota applies to a tenant, a tenant's tool or a tenant's agent, not to a tool and an agent at once",
    );
  }
  const tenant = subjectToken(scope.tenant);
  if (scope.tool !== undefined) return `${tenant}.tool.${subjectToken(scope.tool)}`;
  if (scope.agent !== undefined) return `${tenant}.agent.${subjectToken(scope.agent)}`;
  return tenant;
}

/** Parses a stored quota; a typed `invalid_request` names what is wrong. */
export function parseQuota(value: unknown): Quota {
  const parsed = QuotaSchema.safeParse(value);
  if (!parsed.success) {
    throw new ToolmeshError(
      ErrorCode.InvalidRequest,
      `invalid quota: ${parsed.error.issues.map((i) => `${i.path.join(".") || "(root)"} ${i.message}`).join("; ")}`,
      {
        details: {
          issues: parsed.error.issues.map((i) => ({ path: i.path.join("."), message: i.message })),
        },
      },
    );
  }
  if (parsed.data.burst !== undefined && parsed.data.rate === undefined) {
    throw new ToolmeshError(ErrorCode.InvalidRequest, "invalid quota: burst needs a rate");
  }
  return parsed.data;
}
