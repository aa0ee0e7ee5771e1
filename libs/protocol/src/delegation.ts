import { z } from "zod";
import { ErrorCode, ToolmeshError } from "./errors.js";
import { CallerIdentitySchema } from "./identity.js";

/**
 * What the gateway hands the executors of a `token-exchange` tool when it submits a call: the
 * delegation grant (a refresh token) the authorization server issued for the caller and the
 * tool's audience. Sent once, by core request, to the account that serves the tool; sealed
 * there, never written in the clear.
 */
export const DelegationDepositSchema = z
  .strictObject({
    call_id: z.string().min(1).max(256),
    identity: CallerIdentitySchema,
    audience: z.string().min(1).max(1024),
    grant: z.string().min(1).max(16_384).describe("The refresh token."),
  })
  .meta({ id: "DelegationDeposit", description: "A call's delegation grant, for its executors." });

/** A call's delegation grant, for its executors. */
export type DelegationDeposit = z.infer<typeof DelegationDepositSchema>;

/** The executors' answer to a deposit. */
export const DelegationDepositReplySchema = z.union([
  z.strictObject({ ok: z.literal(true) }),
  z.strictObject({ ok: z.literal(false), error: z.any() }),
]);

/** An OAuth 2.0 token endpoint and the mesh's confidential client there. */
export interface TokenEndpoint {
  url: string;
  clientId: string;
  clientSecret: string;
}

/**
 * The token endpoint named by `TOOLMESH_TOKEN_URL`, `TOOLMESH_TOKEN_CLIENT_ID` and
 * `TOOLMESH_TOKEN_CLIENT_SECRET`; undefined when none is set, an error naming what is missing
 * when only some are.
 */
export function tokenEndpointFromEnv(env: NodeJS.ProcessEnv): TokenEndpoint | undefined {
  const url = env.TOOLMESH_TOKEN_URL;
  const clientId = env.TOOLMESH_TOKEN_CLIENT_ID;
  const clientSecret = env.TOOLMESH_TOKEN_CLIENT_SECRET;
  if (url === undefined && clientId === undefined && clientSecret === undefined) return undefined;
  if (!url || !clientId || !clientSecret)
    throw new Error(
      "token exchange needs TOOLMESH_TOKEN_URL, TOOLMESH_TOKEN_CLIENT_ID and TOOLMESH_TOKEN_CLIENT_SECRET together",
    );
  return { url, clientId, clientSecret };
}

const TokenResponseSchema = z.looseObject({
  access_token: z.string().min(1),
  token_type: z.string().optional(),
  expires_in: z.number().nonnegative().optional(),
  refresh_token: z.string().min(1).optional(),
  issued_token_type: z.string().optional(),
});

/** A successful token response (RFC 6749 §5.1, RFC 8693 §2.2.1). */
export type TokenResponse = z.infer<typeof TokenResponseSchema>;

const TokenErrorSchema = z.looseObject({
  error: z.string(),
  error_description: z.string().optional(),
});

/** Errors of the authorization server that mean the user must authorize again. */
const CONSENT_ERRORS = new Set([
  "invalid_grant",
  "invalid_target",
  "invalid_scope",
  "access_denied",
]);

/**
 * Posts a grant to the token endpoint with client_secret_basic. The user's consent missing,
 * revoked or expired (`invalid_grant` and kin) is `credential_required`; anything else the
 * server or the network does is `unavailable`. No token is put in an error.
 */
export async function requestToken(
  endpoint: TokenEndpoint,
  params: Record<string, string>,
  what: string,
): Promise<TokenResponse> {
  const basic = Buffer.from(
    `${encodeURIComponent(endpoint.clientId)}:${encodeURIComponent(endpoint.clientSecret)}`,
  ).toString("base64");
  let res: Response;
  try {
    res = await fetch(endpoint.url, {
      method: "POST",
      headers: {
        authorization: `Basic ${basic}`,
        "content-type": "application/x-www-form-urlencoded",
        accept: "application/json",
      },
      body: new URLSearchParams(params),
      signal: AbortSignal.timeout(10_000),
    });
  } catch (err) {
    throw new ToolmeshError(
      ErrorCode.Unavailable,
      `the authorization server cannot be reached for ${what}: ${(err as Error).message}`,
    );
  }
  const body: unknown = await res.json().catch(() => undefined);
  if (res.ok) {
    const parsed = TokenResponseSchema.safeParse(body);
    if (parsed.success) return parsed.data;
    throw new ToolmeshError(
      ErrorCode.Unavailable,
      `the authorization server answered ${what} without an access token`,
    );
  }
  const error = TokenErrorSchema.safeParse(body);
  const code = error.success ? error.data.error : `HTTP ${res.status}`;
  if (error.success && CONSENT_ERRORS.has(code))
    throw new ToolmeshError(
      ErrorCode.CredentialRequired,
      `the authorization server refused ${what} (${code}): the user must authorize the tool again`,
      { details: { reason: code } },
    );
  throw new ToolmeshError(
    ErrorCode.Unavailable,
    `the authorization server refused ${what} (${code}); check TOOLMESH_TOKEN_CLIENT_ID and the client's grants`,
    { details: { reason: code } },
  );
}
