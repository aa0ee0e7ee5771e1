import { GatewayEnvSchema } from "@toolmesh/runtime";

/** Why the gateway cannot start with the configuration it was given. */
export class GatewayConfigError extends Error {
  override readonly name = "GatewayConfigError";
}

/** The environment variables of the gateway, with their defaults (the runtime's schema). */
export { GatewayEnvSchema };

/** JWT bearer tokens checked against a JWKS (the gateway as an OAuth 2.1 resource server). */
export interface JwtSettings {
  jwksUrl: string;
  /** Required `iss`; unset: any issuer. */
  issuer?: string;
  /** Required `aud`: default the resource URL. */
  audience?: string;
  /** The claim that names the caller's tenant. Default `tenant`. */
  tenantClaim: string;
  /** The claim listing the agents the caller may use (optional in tokens). Default `agents`. */
  agentsClaim: string;
  /** Scopes every token must hold. */
  requiredScopes: string[];
  /** Authorization servers named in the protected-resource metadata. */
  authorizationServers: string[];
}

/** The gateway's settings, parsed once from the environment. */
export interface GatewayConfig {
  /** TCP port of `/mcp` (0: any free port). Default 8787. */
  port: number;
  /** Address to listen on. Default `127.0.0.1`. */
  host: string;
  /** The static API keys file (YAML or JSON). */
  keysFile?: string;
  /** Serve this tenant to callers with no credential (development only). */
  anonymousTenant?: string;
  jwt?: JwtSettings;
  /** The canonical URL of `/mcp`, for the protected-resource metadata and the JWT audience. */
  resourceUrl?: string;
  /** Largest request body accepted, in bytes. Default 1 MiB. */
  maxBodyBytes: number;
  /** Origins a browser may call from; a request with any other `Origin` is refused. */
  allowedOrigins: string[];
  /** Requests one credential may have in flight on one replica. Default 64. */
  maxConcurrent: number;
  /** Requests per second one credential may make on one replica (0: no limit). Default 100. */
  ratePerS: number;
  /** Requests one credential may make at once above the rate. Default 200. */
  rateBurst: number;
  /**
   * Where the per-credential rate and concurrency are counted: on each replica (`replica`, the
   * default), or shared by every replica through the quota usage bucket (`mesh`).
   */
  limits: "replica" | "mesh";
  /**
   * The key that signs `requestState` (at least 32 characters, the same on every replica);
   * unset: a random key of this process, so only this replica can take a retry.
   */
  requestStateKey?: string;
  /** How long a `requestState` stays valid, in ms. Default 600 000. */
  requestStateTtlMs: number;
  /**
   * The authorization server's page where a user authorizes a tool's audience, `{audience}` and
   * `{scope}` filled in: a caller who has not is asked to open it (URL-mode `input_required`).
   */
  consentUrl?: string;
  /** The environment, for `env:` entries of the keys file. */
  env: Readonly<Record<string, string | undefined>>;
}

/**
 * Reads the gateway's variables. Throws a {@link GatewayConfigError} naming the variable on a bad
 * value, and when no way of authenticating callers is configured.
 */
export function loadGatewayConfig(
  env: Readonly<Record<string, string | undefined>>,
  overrides: Partial<Record<string, string | undefined>> = {},
): GatewayConfig {
  const merged: Record<string, string | undefined> = { ...env };
  for (const [k, v] of Object.entries(overrides)) if (v !== undefined) merged[k] = v;
  for (const [k, v] of Object.entries(merged)) if (v === "") merged[k] = undefined;
  const parsed = GatewayEnvSchema.safeParse(merged);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw new GatewayConfigError(
      `${String(issue?.path[0] ?? "environment")}: ${issue?.message ?? "invalid"}`,
    );
  }
  const e = parsed.data;
  const jwt: JwtSettings | undefined =
    e.TOOLMESH_GATEWAY_JWKS_URL === undefined
      ? undefined
      : {
          jwksUrl: e.TOOLMESH_GATEWAY_JWKS_URL,
          ...(e.TOOLMESH_GATEWAY_JWT_ISSUER === undefined
            ? {}
            : { issuer: e.TOOLMESH_GATEWAY_JWT_ISSUER }),
          ...(e.TOOLMESH_GATEWAY_JWT_AUDIENCE === undefined
            ? {}
            : { audience: e.TOOLMESH_GATEWAY_JWT_AUDIENCE }),
          tenantClaim: e.TOOLMESH_GATEWAY_TENANT_CLAIM,
          agentsClaim: e.TOOLMESH_GATEWAY_AGENTS_CLAIM,
          requiredScopes: e.TOOLMESH_GATEWAY_REQUIRED_SCOPES ?? [],
          authorizationServers: e.TOOLMESH_GATEWAY_AUTHORIZATION_SERVERS ?? [],
        };
  if (
    jwt !== undefined &&
    jwt.audience === undefined &&
    e.TOOLMESH_GATEWAY_RESOURCE_URL === undefined
  )
    throw new GatewayConfigError(
      "TOOLMESH_GATEWAY_JWT_AUDIENCE: required with TOOLMESH_GATEWAY_JWKS_URL (or set TOOLMESH_GATEWAY_RESOURCE_URL, the default audience)",
    );
  if (
    e.TOOLMESH_GATEWAY_KEYS_FILE === undefined &&
    jwt === undefined &&
    e.TOOLMESH_GATEWAY_ANONYMOUS_TENANT === undefined
  ) {
    throw new GatewayConfigError(
      "no authentication configured: set TOOLMESH_GATEWAY_KEYS_FILE or TOOLMESH_GATEWAY_JWKS_URL (or, for development only, TOOLMESH_GATEWAY_ANONYMOUS_TENANT)",
    );
  }
  return {
    port: e.TOOLMESH_GATEWAY_PORT,
    host: e.TOOLMESH_GATEWAY_HOST,
    ...(e.TOOLMESH_GATEWAY_KEYS_FILE === undefined
      ? {}
      : { keysFile: e.TOOLMESH_GATEWAY_KEYS_FILE }),
    ...(e.TOOLMESH_GATEWAY_ANONYMOUS_TENANT === undefined
      ? {}
      : { anonymousTenant: e.TOOLMESH_GATEWAY_ANONYMOUS_TENANT }),
    ...(jwt === undefined ? {} : { jwt }),
    ...(e.TOOLMESH_GATEWAY_RESOURCE_URL === undefined
      ? {}
      : { resourceUrl: e.TOOLMESH_GATEWAY_RESOURCE_URL }),
    maxBodyBytes: e.TOOLMESH_GATEWAY_MAX_BODY_BYTES,
    allowedOrigins: e.TOOLMESH_GATEWAY_ALLOWED_ORIGINS ?? [],
    maxConcurrent: e.TOOLMESH_GATEWAY_MAX_CONCURRENT,
    ratePerS: e.TOOLMESH_GATEWAY_RATE_PER_S,
    rateBurst: e.TOOLMESH_GATEWAY_RATE_BURST,
    limits: e.TOOLMESH_GATEWAY_LIMITS,
    ...(e.TOOLMESH_GATEWAY_REQUEST_STATE_KEY === undefined
      ? {}
      : { requestStateKey: e.TOOLMESH_GATEWAY_REQUEST_STATE_KEY }),
    requestStateTtlMs: e.TOOLMESH_GATEWAY_REQUEST_STATE_TTL_MS,
    ...(e.TOOLMESH_GATEWAY_CONSENT_URL === undefined
      ? {}
      : { consentUrl: e.TOOLMESH_GATEWAY_CONSENT_URL }),
    env,
  };
}
