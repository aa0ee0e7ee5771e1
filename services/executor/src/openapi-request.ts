import { ErrorCode, ToolmeshError } from "@toolmesh/protocol";
import type { HttpRequest } from "@toolmesh/tool-host";
import {
  DEFAULT_ACCEPT,
  fillPath,
  invalidParameter,
  invokeHttp,
  setIdempotencyKey,
  textOf,
} from "@toolmesh/tool-host";
import type { ToolContext } from "@toolmesh/tool-host";

/** Where one parameter of an operation goes, and how it is serialised (OpenAPI `style`). */
export interface ParamPlan {
  /** The property of the tool's input that holds it. */
  property: string;
  /** Its name in the request. */
  name: string;
  in: "path" | "query" | "header" | "cookie";
  style: string;
  explode: boolean;
  /** Sent as JSON text (a parameter with `content: application/json`). */
  json: boolean;
}

/** How one operation's request is made from the tool's arguments, compiled once at load. */
export interface OperationPlan {
  method: string;
  /** The server URL the path is appended to. */
  base: URL;
  /** The path template, `/pets/{petId}`. */
  path: string;
  params: ParamPlan[];
  /** The JSON body: from several top-level properties, or from one property holding it whole. */
  body?:
    | { mediaType: string; properties: string[]; property?: undefined }
    | { mediaType: string; property: string; properties?: undefined };
  /** The tool's input schema. */
  schema: Record<string, unknown>;
}

/** A security scheme's secret, read from the environment at load. Never shown to models. */
export type Credential =
  | { type: "apiKey"; in: "header" | "query" | "cookie"; name: string; value: string }
  | { type: "bearer"; token: string }
  | { type: "basic"; username: string; password: string }
  | {
      type: "oauth2";
      tokenUrl: URL;
      clientId: string;
      clientSecret: string;
      scopes: readonly string[];
    };

/** What a request carries for its security requirement, applied after the arguments. */
export interface AppliedCredentials {
  headers: [string, string][];
  query: [string, string][];
  cookies: [string, string][];
}

const NONE: AppliedCredentials = { headers: [], query: [], cookies: [] };
/** A token is renewed this long before the expiry its server announced, in ms. */
const TOKEN_MARGIN_MS = 30_000;

/**
 * The credentials of one document's security schemes. Picks, per operation, the first
 * security requirement whose schemes all have secrets; fetches and caches OAuth2 tokens
 * (client-credentials flow) until shortly before they expire.
 */
export class CredentialStore {
  readonly #credentials: ReadonlyMap<string, Credential>;
  readonly #fetch: typeof globalThis.fetch;
  readonly #tokens = new Map<string, { token: string; until: number }>();
  readonly #pending = new Map<string, Promise<string>>();

  constructor(credentials: ReadonlyMap<string, Credential>, fetch: typeof globalThis.fetch) {
    this.#credentials = credentials;
    this.#fetch = fetch;
  }

  /** Header names that may carry a credential (dropped on a redirect to another origin). */
  headerNames(): string[] {
    const names = new Set<string>(["authorization", "cookie"]);
    for (const c of this.#credentials.values()) {
      if (c.type === "apiKey" && c.in === "header") names.add(c.name.toLowerCase());
    }
    return [...names];
  }

  /** Whether a configured scheme sends `Authorization` (HTTP bearer or basic, OAuth2, or an API key so named). */
  sendsAuthorization(): boolean {
    return [...this.#credentials.values()].some(
      (c) => c.type !== "apiKey" || (c.in === "header" && c.name.toLowerCase() === "authorization"),
    );
  }

  /** Every configured secret value, to redact from answers. */
  secrets(): string[] {
    return [...this.#credentials.values()].flatMap((c) =>
      c.type === "apiKey"
        ? [c.value]
        : c.type === "bearer"
          ? [c.token]
          : c.type === "basic"
            ? [c.password]
            : [c.clientSecret],
    );
  }

  /**
   * The scheme names an operation's `security` (else the document's) is met with: the first
   * alternative whose schemes all have secrets. An empty list when nothing is required or
   * nothing can be met (reported through `warn`).
   */
  requirementOf(security: unknown, warn: (message: string) => void): string[] {
    if (!Array.isArray(security) || security.length === 0) return [];
    const alternatives = security.filter(
      (s): s is Record<string, unknown> => typeof s === "object" && s !== null,
    );
    if (alternatives.some((s) => Object.keys(s).length === 0)) {
      // An empty alternative makes credentials optional: send them when some are configured.
      const usable = alternatives.find(
        (s) => Object.keys(s).length > 0 && Object.keys(s).every((k) => this.#credentials.has(k)),
      );
      return usable === undefined ? [] : Object.keys(usable);
    }
    for (const alternative of alternatives) {
      const schemes = Object.keys(alternative);
      if (schemes.every((k) => this.#credentials.has(k))) return schemes;
    }
    const wanted = alternatives.map((s) => Object.keys(s).join(" + ")).join(" or ");
    warn(`needs credentials for ${wanted}, none configured in auth; called without credentials`);
    return [];
  }

  /** The headers, query parameters and cookies of a requirement, fetching tokens if needed. */
  async apply(schemes: readonly string[], ctx: ToolContext): Promise<AppliedCredentials> {
    if (schemes.length === 0) return NONE;
    const out: AppliedCredentials = { headers: [], query: [], cookies: [] };
    for (const scheme of schemes) {
      const c = this.#credentials.get(scheme);
      if (c === undefined) continue;
      switch (c.type) {
        case "apiKey":
          if (c.in === "header") out.headers.push([c.name, c.value]);
          else if (c.in === "query") out.query.push([c.name, c.value]);
          else out.cookies.push([c.name, c.value]);
          break;
        case "bearer":
          out.headers.push(["authorization", `Bearer ${c.token}`]);
          break;
        case "basic":
          out.headers.push([
            "authorization",
            `Basic ${Buffer.from(`${c.username}:${c.password}`).toString("base64")}`,
          ]);
          break;
        case "oauth2":
          out.headers.push(["authorization", `Bearer ${await this.#token(scheme, c, ctx)}`]);
          break;
      }
    }
    return out;
  }

  async #token(
    scheme: string,
    c: Extract<Credential, { type: "oauth2" }>,
    ctx: ToolContext,
  ): Promise<string> {
    const cached = this.#tokens.get(scheme);
    if (cached !== undefined && cached.until > Date.now()) return cached.token;
    let pending = this.#pending.get(scheme);
    if (pending === undefined) {
      pending = this.#requestToken(scheme, c, ctx).finally(() => this.#pending.delete(scheme));
      this.#pending.set(scheme, pending);
    }
    return pending;
  }

  async #requestToken(
    scheme: string,
    c: Extract<Credential, { type: "oauth2" }>,
    ctx: ToolContext,
  ): Promise<string> {
    const form = new URLSearchParams({ grant_type: "client_credentials" });
    if (c.scopes.length > 0) form.set("scope", c.scopes.join(" "));
    const headers = new Headers({
      accept: "application/json",
      "content-type": "application/x-www-form-urlencoded",
      // RFC 6749 §2.3.1: the client id and secret form-encoded, then as Basic credentials.
      authorization: `Basic ${Buffer.from(
        `${encodeURIComponent(c.clientId)}:${encodeURIComponent(c.clientSecret)}`,
      ).toString("base64")}`,
    });
    const answer = await invokeHttp(
      {
        tool: `${ctx.tool} (OAuth2 token of ${scheme})`,
        allowed: undefined,
        credentialHeaders: ["authorization"],
        secrets: [c.clientSecret],
        maxResponseBytes: 64 * 1024,
        fetch: this.#fetch,
      },
      { method: "POST", url: c.tokenUrl, headers, body: form.toString() },
      ctx,
    ).catch((err: unknown) => {
      if (err instanceof ToolmeshError && !err.retryable) {
        throw new ToolmeshError(
          ErrorCode.PermissionDenied,
          `the OAuth2 token endpoint of ${scheme} refused the client credentials`,
          { retryable: false, details: err.details, cause: err },
        );
      }
      throw err;
    });
    const body = answer as { access_token?: unknown; expires_in?: unknown };
    if (typeof body?.access_token !== "string") {
      throw new ToolmeshError(
        ErrorCode.Unavailable,
        `the OAuth2 token endpoint of ${scheme} answered without an access_token`,
        { retryable: true },
      );
    }
    const lifetimeMs = typeof body.expires_in === "number" ? body.expires_in * 1000 : 3_600_000;
    this.#tokens.set(scheme, {
      token: body.access_token,
      until: Date.now() + Math.max(0, lifetimeMs - TOKEN_MARGIN_MS),
    });
    return body.access_token;
  }
}

/**
 * The request of one call of an operation: each argument where its parameter says (path,
 * query, header, cookie, serialised by its `style` and `explode`), the JSON body, then the
 * credentials — last, so neither the model nor a preset can replace them.
 */
export function buildOperationRequest(
  plan: OperationPlan,
  args: Record<string, unknown>,
  ctx: ToolContext,
  credentials: AppliedCredentials,
): HttpRequest {
  const headers = new Headers({ accept: DEFAULT_ACCEPT });
  const { query, cookies, pathValues } = placeParameters(plan, args, headers);
  const path = fillPath(plan.path, /\{([^{}]+)\}/g, pathValues);
  const base = plan.base.href.replace(/\/+$/, "");
  const url = new URL(`${base}${path}`);
  for (const [k, v] of query) url.searchParams.append(k, v);
  const body = jsonBody(plan, args);
  if (plan.body !== undefined && body !== undefined) {
    headers.set(
      "content-type",
      plan.body.mediaType === "*/*" ? "application/json" : plan.body.mediaType,
    );
  }
  setIdempotencyKey(headers, plan.method, ctx.idempotencyKey);
  for (const [k, v] of credentials.query) url.searchParams.set(k, v);
  const allCookies = [
    ...cookies.filter(([k]) => !credentials.cookies.some(([c]) => c === k)),
    ...credentials.cookies,
  ];
  if (allCookies.length > 0) {
    headers.set("cookie", allCookies.map(([k, v]) => `${k}=${encodeURIComponent(v)}`).join("; "));
  }
  for (const [k, v] of credentials.headers) headers.set(k, v);
  return { method: plan.method, url, headers, body };
}

/**
 * Puts each argument where its parameter says: headers are set on `headers`; query pairs,
 * cookies and path values are returned for the URL and the credentials to join.
 */
function placeParameters(
  plan: OperationPlan,
  args: Record<string, unknown>,
  headers: Headers,
): { query: [string, string][]; cookies: [string, string][]; pathValues: Map<string, string> } {
  const query: [string, string][] = [];
  const cookies: [string, string][] = [];
  const pathValues = new Map<string, string>();
  for (const p of plan.params) {
    const value = args[p.property];
    if (value === undefined || value === null) continue;
    switch (p.in) {
      case "path": {
        const text = p.json ? JSON.stringify(value) : simple(value, p.explode);
        if (text === "" || text === "." || text === "..") {
          throw invalidParameter(p.property, `cannot be ${JSON.stringify(text)} in the URL path`);
        }
        pathValues.set(p.name, p.json ? encodeURIComponent(text) : pathSegment(p, value));
        break;
      }
      case "query":
        query.push(
          ...(p.json
            ? [[p.name, JSON.stringify(value)] as [string, string]]
            : queryPairs(p, value)),
        );
        break;
      case "header":
        try {
          headers.set(p.name, p.json ? JSON.stringify(value) : simple(value, p.explode));
        } catch {
          throw invalidParameter(p.property, "is not a valid HTTP header value");
        }
        break;
      case "cookie":
        cookies.push([p.name, p.json ? JSON.stringify(value) : simple(value, false)]);
        break;
    }
  }
  return { query, cookies, pathValues };
}

/**
 * The JSON body text: the one property holding it, else the body's properties given (an empty
 * object too, except for GET); undefined when there is none to send.
 */
function jsonBody(plan: OperationPlan, args: Record<string, unknown>): string | undefined {
  if (plan.body === undefined) return undefined;
  if (plan.body.property !== undefined) {
    const value = args[plan.body.property];
    return value === undefined ? undefined : JSON.stringify(value);
  }
  const fields = Object.fromEntries(
    plan.body.properties.filter((k) => args[k] !== undefined).map((k) => [k, args[k]]),
  );
  return Object.keys(fields).length > 0 || plan.method !== "GET"
    ? JSON.stringify(fields)
    : undefined;
}

/** `simple` style: arrays comma-joined, objects `k,v,k,v` (or `k=v,k=v` exploded). */
function simple(value: unknown, explode: boolean): string {
  if (Array.isArray(value)) return value.map(textOf).join(",");
  if (typeof value === "object" && value !== null) {
    return Object.entries(value)
      .map(([k, v]) => (explode ? `${k}=${textOf(v)}` : `${k},${textOf(v)}`))
      .join(",");
  }
  return textOf(value);
}

/** A path parameter by `style`: simple (`a,b`), label (`.a.b`) or matrix (`;id=a;id=b`). */
function pathSegment(p: ParamPlan, value: unknown): string {
  const enc = (v: unknown): string => encodeURIComponent(textOf(v));
  const entries: [string, unknown][] = Array.isArray(value)
    ? value.map((v) => [p.name, v])
    : typeof value === "object" && value !== null
      ? Object.entries(value)
      : [[p.name, value]];
  const isObject = !Array.isArray(value) && typeof value === "object" && value !== null;
  switch (p.style) {
    case "label":
      return p.explode
        ? entries.map(([k, v]) => `.${isObject ? `${enc(k)}=` : ""}${enc(v)}`).join("")
        : `.${entries.map(([k, v]) => (isObject ? `${enc(k)},${enc(v)}` : enc(v))).join(",")}`;
    case "matrix":
      if (p.explode) {
        return entries.map(([k, v]) => `;${enc(isObject ? k : p.name)}=${enc(v)}`).join("");
      }
      return `;${enc(p.name)}=${entries.map(([k, v]) => (isObject ? `${enc(k)},${enc(v)}` : enc(v))).join(",")}`;
    default:
      return entries
        .map(([k, v]) =>
          isObject ? (p.explode ? `${enc(k)}=${enc(v)}` : `${enc(k)},${enc(v)}`) : enc(v),
        )
        .join(",");
  }
}

/** Query pairs by `style`: form (exploded or comma-joined), space/pipe-delimited, deepObject. */
function queryPairs(p: ParamPlan, value: unknown): [string, string][] {
  if (Array.isArray(value)) {
    if (p.style === "spaceDelimited") return [[p.name, value.map(textOf).join(" ")]];
    if (p.style === "pipeDelimited") return [[p.name, value.map(textOf).join("|")]];
    return p.explode
      ? value.map((v) => [p.name, textOf(v)])
      : [[p.name, value.map(textOf).join(",")]];
  }
  if (typeof value === "object" && value !== null) {
    const entries = Object.entries(value);
    if (p.style === "deepObject") return entries.map(([k, v]) => [`${p.name}[${k}]`, textOf(v)]);
    return p.explode
      ? entries.map(([k, v]) => [k, textOf(v)])
      : [[p.name, entries.map(([k, v]) => `${k},${textOf(v)}`).join(",")]];
  }
  return [[p.name, textOf(value)]];
}
