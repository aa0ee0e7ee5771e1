import { readFile, readdir } from "node:fs/promises";
import { extname, join, resolve } from "node:path";
import { parse as parseYaml } from "yaml";
import { z } from "zod";
import {
  Defaults,
  ErrorCode,
  RetryPolicySchema,
  RetryableError,
  TerminalError,
  ToolmeshError,
} from "@toolmesh/protocol";
import { injectTraceHeaders } from "@toolmesh/telemetry";
import type { LoadLog } from "./load-tools.js";
import { ToolLoadError } from "./load-tools.js";
import type { PrivateAddressAllowance } from "./outbound.js";
import {
  outboundFetch,
  privateAddressCause,
  privateAddressDenied,
  trustedHostsOf,
} from "./outbound.js";
import type { ToolContext, ToolModule } from "./tool-module.js";

/** Default folder of native tool files; `TOOLMESH_NATIVE_TOOLS_DIR`'s default must match it. */
export const DEFAULT_NATIVE_TOOLS_DIR = "tools/native";

/** HTTP methods a native tool may use. */
export const NATIVE_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"] as const;

/** An HTTP method a native tool may use. */
export type NativeMethod = (typeof NATIVE_METHODS)[number];

// RFC 9110 token: what a header name may be made of.
const HEADER_NAME = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;
const PLACEHOLDER = /\{([^{}]*)\}/g;
const FILE_EXTENSIONS = new Set([".yaml", ".yml"]);
const REDIRECTS = new Set([301, 302, 303, 307, 308]);
const MAX_REDIRECTS = 5;
/** Bytes of an error response's body kept in the error's details. */
const ERROR_BODY_BYTES = 4096;
const REDACTED = "[redacted]";

const PlacementSchema = z.union([
  z.enum(["path", "query", "body", "header"]),
  z.strictObject({ header: z.string().regex(HEADER_NAME, "must be an HTTP header name") }),
]);

const AuthSchema = z.strictObject({
  method: z.enum(["api_key", "bearer"]),
  header: z.string().regex(HEADER_NAME, "must be an HTTP header name").optional(),
  env: z.string().regex(ENV_NAME, "must be an environment variable name"),
});

/**
 * One native tool file (`tools/native/*.yaml`). Field names follow the YAML/wire convention
 * (snake_case). Durations in ms.
 */
export const NativeToolFileSchema = z.strictObject({
  name: z.string().min(1).max(128),
  description: z.string(),
  summary: z.string().optional(),
  /** JSON Schema (2020-12) of the arguments, an object schema. */
  parameters: z.record(z.string(), z.unknown()).default({ type: "object", properties: {} }),
  /** `http(s)://host/path`, with `{param}` placeholders after the host. */
  api_url: z.string().min(1),
  method: z
    .string()
    .transform((m) => m.toUpperCase())
    .pipe(z.enum(NATIVE_METHODS))
    .default("GET"),
  /**
   * Where each argument goes: `path`, `query`, `body`, `header` (named after the param) or
   * `{ header: Name }`. Default: `path` for api_url placeholders, else `query` for GET and
   * `body` otherwise.
   */
  placement: z.record(z.string(), PlacementSchema).default({}),
  /** The secret is read from the variable `env` of the executor's environment at load. */
  auth: AuthSchema.optional(),
  timeout_ms: z.number().int().positive().optional(),
  retry: RetryPolicySchema.partial().strict().optional(),
  groups: z.array(z.string().min(1)).optional(),
  presets: z.record(z.string(), z.unknown()).optional(),
  /**
   * Whether calls to api_url's own host skip the private-address check (the operator wrote that
   * host; redirects elsewhere stay guarded). Default `TOOLMESH_TRUST_CONFIGURED_HOSTS` (true).
   */
  trust_configured_host: z.boolean().optional(),
});

/** One native tool file as written. */
export type NativeToolFile = z.input<typeof NativeToolFileSchema>;

/** Options of {@link loadNativeToolsDir}. */
export interface NativeToolsOptions {
  /**
   * URL prefixes the tools may call (`TOOLMESH_NATIVE_ALLOWED_URLS`): same origin, and the
   * path under the prefix's path. Checked at load and again for every request. Default any.
   */
  allowedUrls?: readonly string[];
  /** A missing folder means no native tools instead of an error. Default false. */
  missingOk?: boolean;
  /** Names already served (name → where from): such a tool is skipped with a warning. */
  taken?: ReadonlyMap<string, string>;
  /** Largest successful response body accepted, in bytes. Default 1 MiB. */
  maxResponseBytes?: number;
  /**
   * Private addresses the tools may reach (`TOOLMESH_ALLOW_PRIVATE_ADDRESSES`), checked on
   * every connection after DNS resolution and redirects. Default none.
   */
  allowPrivateAddresses?: PrivateAddressAllowance;
  /**
   * Whether each tool's own api_url host is trusted (`TOOLMESH_TRUST_CONFIGURED_HOSTS`), unless
   * its file's `trust_configured_host` says otherwise. Default true.
   */
  trustConfiguredHosts?: boolean;
  /**
   * The fetch implementation. Default {@link outboundFetch} of `allowPrivateAddresses`, one per
   * tool, trusting that tool's configured host.
   */
  fetch?: typeof globalThis.fetch;
}

type Placement = { in: "path" | "query" | "body" } | { in: "header"; name: string };

/** What a tool's handler needs, compiled once at load. */
interface CompiledTool {
  name: string;
  method: NativeMethod;
  apiUrl: string;
  placementOf(param: string): Placement;
  auth?: { header: string; value: string; secret: string };
  allowed: readonly AllowedPrefix[] | undefined;
  maxResponseBytes: number;
  fetch: typeof globalThis.fetch;
}

interface AllowedPrefix {
  origin: string;
  path: string;
}

/**
 * Loads every `.yaml`/`.yml` file of a folder (not recursive, in file-name order), one native
 * HTTP tool each, as executor tool modules of kind `native`. A file that is not a valid tool,
 * an auth variable missing from `env`, or an `api_url` outside `allowedUrls` fails the load,
 * naming the file. A repeated name keeps the first and warns (README.md#writing-a-tool). Secrets are read
 * from `env` here and kept inside the handler: never in the module's fields or in errors.
 */
export async function loadNativeToolsDir(
  dir: string,
  env: Readonly<Record<string, string | undefined>>,
  log: LoadLog,
  options: NativeToolsOptions = {},
): Promise<ToolModule[]> {
  const root = resolve(dir);
  let entries: string[];
  try {
    entries = (await readdir(root)).filter((f) => FILE_EXTENSIONS.has(extname(f))).sort();
  } catch (err) {
    if (options.missingOk === true && (err as NodeJS.ErrnoException).code === "ENOENT") return [];
    throw new ToolLoadError(`cannot read native tools folder ${root}: ${(err as Error).message}`, {
      cause: err,
    });
  }
  const allowed = options.allowedUrls?.map(allowedPrefix);
  const seen = new Map<string, string>(options.taken);
  const modules: ToolModule[] = [];
  for (const entry of entries) {
    const file = join(root, entry);
    const spec = await readToolFile(file);
    const first = seen.get(spec.name);
    if (first !== undefined) {
      log.warn(
        { tool: spec.name, kept: first, skipped: file },
        "duplicate tool name; the first one wins",
      );
      continue;
    }
    seen.set(spec.name, file);
    // api_url's host has no placeholder (checked at load), so no argument can change it.
    const host = new URL(spec.api_url.replace(PLACEHOLDER, "x"));
    const fetch =
      options.fetch ??
      outboundFetch(
        options.allowPrivateAddresses,
        trustedHostsOf(host, spec.trust_configured_host, options.trustConfiguredHosts),
      );
    modules.push(nativeToolModule(spec, file, env, allowed, options, fetch));
  }
  return modules;
}

async function readToolFile(file: string): Promise<z.output<typeof NativeToolFileSchema>> {
  let document: unknown;
  try {
    document = parseYaml(await readFile(file, "utf8"));
  } catch (err) {
    throw new ToolLoadError(`${file} is not a readable YAML file: ${(err as Error).message}`, {
      cause: err,
    });
  }
  const parsed = NativeToolFileSchema.safeParse(document);
  if (!parsed.success) {
    throw new ToolLoadError(`${file} is not a native tool: ${z.prettifyError(parsed.error)}`);
  }
  const problems = checkToolFile(parsed.data);
  if (problems.length > 0) {
    throw new ToolLoadError(`${file} is not a native tool: ${problems.join("; ")}`);
  }
  return parsed.data;
}

/** What is wrong with a schema-valid tool file beyond its shape; empty when nothing. */
function checkToolFile(spec: z.output<typeof NativeToolFileSchema>): string[] {
  const problems: string[] = [];
  const properties = spec.parameters.properties;
  if (properties !== undefined && (typeof properties !== "object" || properties === null)) {
    problems.push("parameters.properties must be an object");
  }
  const known = new Set([...Object.keys(properties ?? {}), ...Object.keys(spec.presets ?? {})]);
  const authority = /^https?:\/\/[^/?#{}]+(?=[/?#]|$)/i.exec(spec.api_url);
  if (authority === null) {
    problems.push(
      `api_url ${JSON.stringify(spec.api_url)} must start with http:// or https:// and a host without placeholders`,
    );
    return problems;
  }
  const sample = spec.api_url.replace(PLACEHOLDER, "x");
  if (!URL.canParse(sample)) {
    problems.push(`api_url ${JSON.stringify(spec.api_url)} is not a URL`);
    return problems;
  }
  const url = new URL(sample);
  if (url.username !== "" || url.password !== "") {
    problems.push("api_url must not hold credentials; use auth");
  }
  const placeholders = pathPlaceholders(spec.api_url);
  for (const name of placeholders) {
    if (!known.has(name)) {
      problems.push(`api_url placeholder {${name}} is not a parameter or preset`);
    }
    const explicit = spec.placement[name];
    if (explicit !== undefined && explicit !== "path") {
      problems.push(`placement.${name}: an api_url placeholder must be placed in the path`);
    }
  }
  for (const [name, placement] of Object.entries(spec.placement)) {
    if (!known.has(name)) problems.push(`placement.${name}: not a parameter or preset`);
    if (placement === "path" && !placeholders.has(name)) {
      problems.push(`placement.${name}: path, but api_url has no {${name}} placeholder`);
    }
    if (placement === "body" && spec.method === "GET") {
      problems.push(`placement.${name}: a GET request has no body`);
    }
  }
  return problems;
}

function pathPlaceholders(apiUrl: string): Set<string> {
  return new Set([...apiUrl.matchAll(PLACEHOLDER)].map((m) => m[1] ?? ""));
}

function allowedPrefix(prefix: string): AllowedPrefix {
  const url = new URL(prefix);
  return { origin: url.origin, path: url.pathname };
}

/** Same origin, and the path equal to the prefix's or under it (segment-wise). */
function isAllowed(url: URL, allowed: readonly AllowedPrefix[] | undefined): boolean {
  if (allowed === undefined) return true;
  return allowed.some(
    (p) =>
      url.origin === p.origin &&
      (p.path.endsWith("/")
        ? url.pathname.startsWith(p.path)
        : url.pathname === p.path || url.pathname.startsWith(`${p.path}/`)),
  );
}

function nativeToolModule(
  spec: z.output<typeof NativeToolFileSchema>,
  file: string,
  env: Readonly<Record<string, string | undefined>>,
  allowed: readonly AllowedPrefix[] | undefined,
  options: NativeToolsOptions,
  fetch: typeof globalThis.fetch,
): ToolModule {
  if (!isAllowed(new URL(spec.api_url.replace(PLACEHOLDER, "x")), allowed)) {
    throw new ToolLoadError(
      `${file}: api_url ${spec.api_url} is outside TOOLMESH_NATIVE_ALLOWED_URLS`,
    );
  }
  let auth: CompiledTool["auth"];
  if (spec.auth !== undefined) {
    const secret = env[spec.auth.env];
    if (secret === undefined || secret === "") {
      throw new ToolLoadError(
        `${file}: auth needs the environment variable ${spec.auth.env}, which is not set`,
      );
    }
    const bearer = spec.auth.method === "bearer";
    auth = {
      header: spec.auth.header ?? (bearer ? "Authorization" : "X-API-Key"),
      value: bearer ? `Bearer ${secret}` : secret,
      secret,
    };
  }
  const placeholders = pathPlaceholders(spec.api_url);
  const fallback: Placement = { in: spec.method === "GET" ? "query" : "body" };
  const placements = new Map<string, Placement>(
    Object.entries(spec.placement).map(([name, p]) => [
      name,
      typeof p === "object"
        ? { in: "header", name: p.header }
        : p === "header"
          ? { in: "header", name }
          : { in: p },
    ]),
  );
  const tool: CompiledTool = {
    name: spec.name,
    method: spec.method,
    apiUrl: spec.api_url,
    placementOf: (param) =>
      placements.get(param) ?? (placeholders.has(param) ? { in: "path" } : fallback),
    ...(auth === undefined ? {} : { auth }),
    allowed,
    maxResponseBytes: options.maxResponseBytes ?? Defaults.maxMessageBytes,
    fetch,
  };
  return {
    name: spec.name,
    description: spec.description,
    ...(spec.summary === undefined ? {} : { summary: spec.summary }),
    parameters: spec.parameters,
    ...(spec.groups === undefined ? {} : { groups: spec.groups }),
    ...(spec.presets === undefined ? {} : { presets: spec.presets }),
    ...(spec.timeout_ms === undefined ? {} : { timeoutMs: spec.timeout_ms }),
    ...(spec.retry === undefined ? {} : { retry: spec.retry }),
    kind: "native",
    origin: { api_url: spec.api_url, method: spec.method },
    handler: (args, ctx) => callApi(tool, args, ctx),
  };
}

/** A request as built from the arguments, before it is sent. */
interface NativeRequest {
  url: URL;
  headers: Headers;
  body: string | undefined;
}

function buildRequest(
  tool: CompiledTool,
  args: Record<string, unknown>,
  ctx: ToolContext,
): NativeRequest {
  const pathValues = new Map<string, string>();
  const query: [string, string][] = [];
  const body: Record<string, unknown> = {};
  let hasBody = false;
  const headers = new Headers({ accept: "application/json, text/*;q=0.9, */*;q=0.8" });
  for (const [name, value] of Object.entries(args)) {
    if (value === undefined) continue;
    const placement = tool.placementOf(name);
    switch (placement.in) {
      case "path": {
        const text = value === null ? "" : textOf(value);
        // "." and ".." would move the request to another path once the URL is normalised.
        if (text === "" || text === "." || text === "..") {
          throw invalidParameter(name, `cannot be ${JSON.stringify(text)} in the URL path`);
        }
        pathValues.set(name, encodeURIComponent(text));
        break;
      }
      case "query":
        if (value === null) break;
        for (const item of Array.isArray(value) ? (value as unknown[]) : [value]) {
          query.push([name, textOf(item)]);
        }
        break;
      case "header":
        if (value === null) break;
        try {
          headers.set(
            placement.name,
            Array.isArray(value) ? value.map(textOf).join(", ") : textOf(value),
          );
        } catch {
          throw invalidParameter(name, "is not a valid HTTP header value");
        }
        break;
      case "body":
        body[name] = value;
        hasBody = true;
        break;
    }
  }
  let missing: string | undefined;
  const expanded = tool.apiUrl.replace(PLACEHOLDER, (_, name: string) => {
    const value = pathValues.get(name);
    if (value === undefined) missing ??= name;
    return value ?? "";
  });
  if (missing !== undefined) {
    throw invalidParameter(missing, "is required: the URL path holds it");
  }
  const url = new URL(expanded);
  for (const [name, value] of query) url.searchParams.append(name, value);
  if (tool.method !== "GET" && !headers.has("idempotency-key")) {
    // Lets the API make the side effect exactly-once across retries and redeliveries.
    headers.set("idempotency-key", ctx.idempotencyKey);
  }
  const sendsBody =
    hasBody || tool.method === "POST" || tool.method === "PUT" || tool.method === "PATCH";
  if (sendsBody) headers.set("content-type", "application/json");
  // Set last: neither the model nor a preset can replace the configured credential.
  if (tool.auth !== undefined) headers.set(tool.auth.header, tool.auth.value);
  injectTraceHeaders({ get: (k) => headers.get(k) ?? "", set: (k, v) => headers.set(k, v) });
  return { url, headers, body: sendsBody ? JSON.stringify(body) : undefined };
}

/** The handler of a native tool: one HTTP request (following redirects) per attempt. */
async function callApi(
  tool: CompiledTool,
  args: Record<string, unknown>,
  ctx: ToolContext,
): Promise<unknown> {
  const request = buildRequest(tool, args, ctx);
  let { url, body } = request;
  let method: string = tool.method;
  const started = performance.now();
  let response: Response;
  for (let hop = 0; ; hop++) {
    if (!isAllowed(url, tool.allowed)) {
      throw new ToolmeshError(
        ErrorCode.PermissionDenied,
        `"${tool.name}" may not call ${url.origin}${hop === 0 ? "" : " (redirected)"}: the URL is outside TOOLMESH_NATIVE_ALLOWED_URLS`,
        { retryable: false, details: { origin: url.origin } },
      );
    }
    try {
      response = await tool.fetch(url, {
        method,
        headers: request.headers,
        ...(body === undefined ? {} : { body }),
        signal: ctx.signal,
        // Followed here, so every hop passes the allow-list and credentials stay on their origin.
        redirect: "manual",
      });
    } catch (err) {
      throw unreachable(tool, url, err, ctx);
    }
    const location = response.headers.get("location");
    if (!REDIRECTS.has(response.status) || location === null) break;
    await response.body?.cancel().catch(() => undefined);
    if (hop >= MAX_REDIRECTS) {
      throw new TerminalError(`"${tool.name}" was redirected more than ${MAX_REDIRECTS} times`, {
        details: { status: response.status },
      });
    }
    const next = URL.canParse(location, url.href) ? new URL(location, url) : undefined;
    if (next === undefined || (next.protocol !== "http:" && next.protocol !== "https:")) {
      throw new TerminalError(`"${tool.name}" was redirected to an unusable location`, {
        details: { status: response.status },
      });
    }
    if (next.origin !== url.origin && tool.auth !== undefined) {
      request.headers.delete(tool.auth.header);
    }
    if (
      response.status === 303 ||
      (response.status !== 307 && response.status !== 308 && method === "POST")
    ) {
      method = "GET";
      body = undefined;
      request.headers.delete("content-type");
    }
    url = next;
  }
  const status = response.status;
  ctx.log.debug(
    {
      method,
      host: url.host,
      status,
      duration_ms: Math.round((performance.now() - started) * 1000) / 1000,
    },
    "native tool request answered",
  );
  if (status >= 200 && status < 300) {
    const { text, truncated } = await readBody(response, tool.maxResponseBytes, tool, url, ctx);
    if (truncated) {
      throw new ToolmeshError(
        ErrorCode.PayloadTooLarge,
        `"${tool.name}" answered more than ${tool.maxResponseBytes} bytes`,
        { retryable: false, details: { limit: tool.maxResponseBytes } },
      );
    }
    return resultOf(redact(text, tool), response.headers.get("content-type"));
  }
  const excerpt = await readBody(response, ERROR_BODY_BYTES, tool, url, ctx);
  const details: Record<string, unknown> = {
    status,
    body: redact(excerpt.text, tool),
    ...(excerpt.truncated ? { body_truncated: true } : {}),
  };
  if (status === 429 || status >= 500) {
    const retryAfter = retryAfterMs(response.headers.get("retry-after"));
    throw new RetryableError(`"${tool.name}" answered HTTP ${status}`, {
      ...(retryAfter === undefined ? {} : { retryAfterMs: retryAfter }),
      details: retryAfter === undefined ? details : { ...details, retry_after_ms: retryAfter },
    });
  }
  throw new TerminalError(`"${tool.name}" answered HTTP ${status}`, { details });
}

/**
 * Milliseconds a `Retry-After` header asks to wait: delay-seconds or an HTTP date (RFC 9110
 * §10.2.3). Undefined when absent or unreadable; never negative.
 */
export function retryAfterMs(value: string | null, now = Date.now()): number | undefined {
  if (value === null) return undefined;
  const text = value.trim();
  if (/^\d+$/.test(text)) return Number(text) * 1000;
  const at = Date.parse(text);
  return Number.isNaN(at) ? undefined : Math.max(0, at - now);
}

/** Reads at most `limit` bytes of the body as UTF-8; `truncated` when there was more. */
async function readBody(
  response: Response,
  limit: number,
  tool: CompiledTool,
  url: URL,
  ctx: ToolContext,
): Promise<{ text: string; truncated: boolean }> {
  if (response.body === null) return { text: "", truncated: false };
  const reader = (response.body as ReadableStream<Uint8Array>).getReader();
  const decoder = new TextDecoder();
  let text = "";
  let bytes = 0;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return { text: text + decoder.decode(), truncated: false };
      if (bytes + value.byteLength > limit) {
        text += decoder.decode(value.subarray(0, limit - bytes), { stream: true });
        await reader.cancel().catch(() => undefined);
        return { text, truncated: true };
      }
      bytes += value.byteLength;
      text += decoder.decode(value, { stream: true });
    }
  } catch (err) {
    throw unreachable(tool, url, err, ctx);
  } finally {
    reader.releaseLock();
  }
}

/** JSON bodies as parsed JSON (so the content is JSON text); anything else as text. */
function resultOf(text: string, contentType: string | null): unknown {
  const mediaType = (contentType ?? "").split(";", 1)[0]?.trim().toLowerCase() ?? "";
  if (text.trim() === "" || !(mediaType === "application/json" || mediaType.endsWith("+json"))) {
    return text;
  }
  try {
    const value: unknown = JSON.parse(text);
    // Strings and null would lose their JSON form in the tool message's content.
    return typeof value === "string" || value === null ? JSON.stringify(value) : value;
  } catch {
    return text;
  }
}

/** The server echoing the credential back must not carry it into results, errors or logs. */
function redact(text: string, tool: CompiledTool): string {
  const secret = tool.auth?.secret;
  return secret === undefined || secret.length < 4 ? text : text.split(secret).join(REDACTED);
}

/**
 * A failure to reach the API (or to read its answer): retryable `unavailable`; an address
 * the tool may not reach is `permission_denied`.
 */
function unreachable(tool: CompiledTool, url: URL, err: unknown, ctx: ToolContext): unknown {
  // An aborted attempt is reported by the executor from the signal's reason.
  if (ctx.signal.aborted) return err;
  const refused = privateAddressCause(err);
  if (refused !== undefined) return privateAddressDenied(tool.name, url.origin, refused);
  const cause = (err as { cause?: { code?: unknown; message?: unknown } }).cause;
  const reason =
    typeof cause?.code === "string"
      ? cause.code
      : typeof cause?.message === "string"
        ? cause.message
        : (err as Error).message;
  return new ToolmeshError(
    ErrorCode.Unavailable,
    `"${tool.name}" cannot reach ${url.origin}: ${reason}`,
    { retryable: true, details: { origin: url.origin, reason }, cause: err },
  );
}

function invalidParameter(name: string, problem: string): ToolmeshError {
  return new ToolmeshError(ErrorCode.InvalidParameters, `parameter "${name}" ${problem}`, {
    retryable: false,
    details: {
      errors: [{ path: `/${name.replaceAll("~", "~0").replaceAll("/", "~1")}`, message: problem }],
    },
  });
}

/** A value as it goes into a URL or a header: strings as they are, the rest as JSON. */
function textOf(value: unknown): string {
  if (typeof value === "string") return value;
  if (typeof value === "number" || typeof value === "boolean" || typeof value === "bigint") {
    return String(value);
  }
  return JSON.stringify(value) ?? "";
}
