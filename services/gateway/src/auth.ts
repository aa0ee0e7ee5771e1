import { createHash } from "node:crypto";
import { readFile } from "node:fs/promises";
import { errors as joseErrors, createRemoteJWKSet, jwtVerify } from "jose";
import type { JWTPayload } from "jose";
import { parse as parseYaml } from "yaml";
import { z } from "zod";
import type { CatalogRequest } from "@toolmesh/protocol";
import type { Logger } from "@toolmesh/telemetry";
import type { Actor, CallerIdentity } from "@toolmesh/protocol";
import { CallerIdentitySchema, GATEWAY_KEY_ISSUER } from "@toolmesh/protocol";
import type { GatewayConfig, JwtSettings } from "./config.js";
import { GatewayConfigError } from "./config.js";
import { KeysFileWatcher } from "./keys-file-watcher.js";

/**
 * The tool names a request is served: the mesh's own (`calc.add`), or their provider-safe forms
 * (`calc_add`, `^[a-zA-Z0-9_-]{1,64}$`, as OpenAI and Anthropic require; ADR 0057).
 */
export type ToolNames = NonNullable<CatalogRequest["names"]>;

/** The values of {@link ToolNames}. */
export const TOOL_NAMES = ["mesh", "provider_safe"] as const satisfies readonly ToolNames[];

/** Who a request acts for, as its credential says. */
export interface Principal {
  readonly tenant: string;
  /** The agents the credential may use; undefined: any. */
  readonly agents?: readonly string[];
  /** The tool names the credential is served unless its endpoint says otherwise; undefined: mesh. */
  readonly names?: ToolNames;
  /** Names the credential for limits and logs (never the secret itself). */
  readonly credential: string;
  /** Who calls made with the credential act for; absent for keys that name no subject. */
  readonly identity?: CallerIdentity;
}

/** Why a request was not let in: 401 (no or bad credential) or 403 (not enough scope). */
export class AuthError extends Error {
  override readonly name = "AuthError";
  readonly status: 401 | 403;
  /** The RFC 6750 `error` attribute, when there is one. */
  readonly code: "invalid_token" | "insufficient_scope" | undefined;

  constructor(
    status: 401 | 403,
    code: "invalid_token" | "insufficient_scope" | undefined,
    message: string,
  ) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

const KeyEntrySchema = z
  .object({
    sha256: z
      .string()
      .regex(/^[0-9a-fA-F]{64}$/, "must be 64 hex digits (the SHA-256 of the key)")
      .optional(),
    env: z.string().min(1).optional(),
    tenant: z.string().min(1).max(256),
    agents: z.array(z.string().min(1)).min(1).optional(),
    names: z.enum(TOOL_NAMES).optional(),
    name: z.string().min(1).optional(),
    subject: z.string().min(1).max(1024).optional(),
  })
  .strict()
  .refine((e) => (e.sha256 === undefined) !== (e.env === undefined), {
    message: "each key needs exactly one of sha256 and env",
  });

const KeysFileSchema = z.object({ keys: z.array(KeyEntrySchema) }).strict();

/** SHA-256 of a key, lower-case hex: what a keys file stores. */
export function keyDigest(key: string): string {
  return createHash("sha256").update(key, "utf8").digest("hex");
}

/** Reads a keys file (YAML or JSON): the principal of each key, by the key's SHA-256. */
export async function loadKeysFile(
  path: string,
  env: Readonly<Record<string, string | undefined>>,
): Promise<Map<string, Principal>> {
  let text: string;
  try {
    text = await readFile(path, "utf8");
  } catch (err) {
    throw new GatewayConfigError(
      `TOOLMESH_GATEWAY_KEYS_FILE: cannot read ${path}: ${(err as Error).message}`,
    );
  }
  let data: unknown;
  try {
    data = parseYaml(text); // JSON is YAML
  } catch (err) {
    throw new GatewayConfigError(`${path}: not YAML or JSON: ${(err as Error).message}`);
  }
  const parsed = KeysFileSchema.safeParse(data);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw new GatewayConfigError(
      `${path}: /${issue?.path.join("/") ?? ""} ${issue?.message ?? "invalid"}`,
    );
  }
  const keys = new Map<string, Principal>();
  for (const [index, entry] of parsed.data.keys.entries()) {
    let digest: string;
    if (entry.env !== undefined) {
      const value = env[entry.env];
      if (value === undefined || value === "")
        throw new GatewayConfigError(`${path}: /keys/${index}: variable ${entry.env} is not set`);
      digest = keyDigest(value);
    } else digest = (entry.sha256 ?? "").toLowerCase();
    if (keys.has(digest)) throw new GatewayConfigError(`${path}: /keys/${index}: a repeated key`);
    keys.set(digest, {
      tenant: entry.tenant,
      ...(entry.agents === undefined ? {} : { agents: entry.agents }),
      ...(entry.names === undefined ? {} : { names: entry.names }),
      credential: `key:${entry.name ?? digest.slice(0, 12)}`,
      ...(entry.subject === undefined
        ? {}
        : {
            identity: { issuer: GATEWAY_KEY_ISSUER, subject: entry.subject, tenant: entry.tenant },
          }),
    });
  }
  return keys;
}

/** Checks bearer credentials: static keys, JWTs from a JWKS, or none (an anonymous tenant). */
export class Authenticator {
  readonly #keys: () => Map<string, Principal>;
  readonly #watcher: KeysFileWatcher | undefined;
  readonly #jwt: JwtSettings | undefined;
  readonly #jwks: ReturnType<typeof createRemoteJWKSet> | undefined;
  readonly #audience: string | undefined;
  readonly #anonymous: Principal | undefined;

  private constructor(
    watcher: KeysFileWatcher | undefined,
    jwt: JwtSettings | undefined,
    audience: string | undefined,
    anonymousTenant: string | undefined,
  ) {
    this.#watcher = watcher;
    const none = new Map<string, Principal>();
    this.#keys = watcher === undefined ? () => none : () => watcher.current();
    this.#jwt = jwt;
    this.#jwks = jwt === undefined ? undefined : createRemoteJWKSet(new URL(jwt.jwksUrl));
    this.#audience = audience;
    this.#anonymous =
      anonymousTenant === undefined
        ? undefined
        : { tenant: anonymousTenant, credential: "anonymous" };
  }

  /**
   * Builds the authenticator the configuration describes: reads the keys file, and reads it
   * again whenever it changes ({@link KeysFileWatcher}).
   */
  static async create(config: GatewayConfig, log?: Logger): Promise<Authenticator> {
    const watcher =
      config.keysFile === undefined
        ? undefined
        : await KeysFileWatcher.open(config.keysFile, {
            env: config.env,
            ...(log === undefined ? {} : { log }),
          });
    return new Authenticator(
      watcher,
      config.jwt,
      config.jwt?.audience ?? config.resourceUrl,
      config.anonymousTenant,
    );
  }

  /** Stops following the keys file. */
  close(): void {
    this.#watcher?.close();
  }

  /** Whether OAuth (JWT) is configured: then the protected-resource metadata is served. */
  get oauth(): JwtSettings | undefined {
    return this.#jwt;
  }

  /** The principal of an `Authorization` header value; throws {@link AuthError}. */
  async authenticate(authorization: string | undefined): Promise<Principal> {
    if (authorization === undefined || authorization === "") {
      if (this.#anonymous !== undefined) return this.#anonymous;
      throw new AuthError(401, undefined, "no credential: send Authorization: Bearer <key>");
    }
    const match = /^Bearer +([^ ]+) *$/i.exec(authorization);
    if (match === null) throw new AuthError(401, "invalid_token", "not a Bearer credential");
    const token = match[1] ?? "";
    const byKey = this.#keys().get(keyDigest(token));
    if (byKey !== undefined) return byKey;
    if (this.#jwt !== undefined && token.split(".").length === 3) return this.#verifyJwt(token);
    throw new AuthError(401, "invalid_token", "unknown key");
  }

  async #verifyJwt(token: string): Promise<Principal> {
    const jwt = this.#jwt as JwtSettings;
    let payload: JWTPayload;
    try {
      ({ payload } = await jwtVerify(token, this.#jwks as ReturnType<typeof createRemoteJWKSet>, {
        ...(jwt.issuer === undefined ? {} : { issuer: jwt.issuer }),
        ...(this.#audience === undefined ? {} : { audience: this.#audience }),
        requiredClaims: ["exp"],
      }));
    } catch (err) {
      throw new AuthError(401, "invalid_token", tokenProblem(err));
    }
    const tenant = payload[jwt.tenantClaim];
    if (typeof tenant !== "string" || tenant === "" || tenant.length > 256)
      throw new AuthError(401, "invalid_token", `token has no string claim ${jwt.tenantClaim}`);
    const scopes = scopesOf(payload);
    const lacking = jwt.requiredScopes.filter((s) => !scopes.has(s));
    if (lacking.length > 0)
      throw new AuthError(403, "insufficient_scope", `token lacks scope ${lacking.join(" ")}`);
    const agents = payload[jwt.agentsClaim];
    const agentList =
      Array.isArray(agents) && agents.every((a) => typeof a === "string" && a !== "")
        ? (agents as string[])
        : undefined;
    const identity = identityOf(payload, tenant);
    const principal: Principal = {
      tenant,
      ...(agentList === undefined ? {} : { agents: agentList }),
      credential: `jwt:${payload.sub ?? tenant}`,
      ...(identity === undefined ? {} : { identity }),
    };
    BEARERS.set(principal, token);
    return principal;
  }
}

/**
 * The verified JWT each principal came with, beside it rather than on it, so that no log or
 * message that shows a principal can show the token.
 */
const BEARERS = new WeakMap<Principal, string>();

/** The verified JWT a principal came with, for a token exchange; undefined for keys. */
export function bearerTokenOf(principal: Principal): string | undefined {
  return BEARERS.get(principal);
}

/**
 * The identity a verified JWT vouches for: its issuer and subject in its tenant, and the chain
 * of services acting for the subject (RFC 8693 `act`, nested, nearest first). No identity
 * without both `iss` and `sub`. The token itself is not kept.
 */
function identityOf(payload: JWTPayload, tenant: string): CallerIdentity | undefined {
  const { iss, sub } = payload;
  if (typeof iss !== "string" || iss === "" || typeof sub !== "string" || sub === "")
    return undefined;
  const actor: Actor[] = [];
  let act: unknown = payload.act;
  while (typeof act === "object" && act !== null && actor.length < 8) {
    const { sub: actSub, iss: actIss, act: next } = act as Record<string, unknown>;
    if (typeof actSub !== "string" || actSub === "") break;
    actor.push({ subject: actSub, ...(typeof actIss === "string" ? { issuer: actIss } : {}) });
    act = next;
  }
  const identity = CallerIdentitySchema.safeParse({
    issuer: iss,
    subject: sub,
    tenant,
    ...(actor.length === 0 ? {} : { actor }),
  });
  return identity.success ? identity.data : undefined;
}

function scopesOf(payload: JWTPayload): Set<string> {
  const scope = payload.scope ?? payload.scp;
  if (typeof scope === "string") return new Set(scope.split(" ").filter((s) => s !== ""));
  if (Array.isArray(scope)) return new Set(scope.filter((s): s is string => typeof s === "string"));
  return new Set();
}

function tokenProblem(err: unknown): string {
  if (err instanceof joseErrors.JWTExpired) return "token expired";
  if (err instanceof joseErrors.JWTClaimValidationFailed)
    return `token claim ${err.claim} is not acceptable (${err.reason})`;
  if (err instanceof joseErrors.JWKSNoMatchingKey) return "token not signed by a known key";
  if (err instanceof joseErrors.JWSSignatureVerificationFailed) return "token signature invalid";
  if (err instanceof joseErrors.JWKSTimeout || err instanceof joseErrors.JOSEError)
    return `token not verified: ${err.message}`;
  return "token not verified";
}
