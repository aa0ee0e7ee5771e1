import { readFile, readdir } from "node:fs/promises";
import { extname, join, resolve } from "node:path";
import { parse as parseYaml } from "yaml";
import { z } from "zod";
import { Defaults, issuesLine, RetryPolicySchema } from "@toolmesh/protocol";
import type { HttpEndpoint, HttpRequest } from "@toolmesh/tool-host";
import {
  DEFAULT_ACCEPT,
  UrlAllowList,
  fillPath,
  invalidParameter,
  invokeHttp,
  setIdempotencyKey,
  textOf,
} from "@toolmesh/tool-host";
import type { LoadLog } from "./tool-source.js";
import { ToolLoadError } from "./load-tools.js";
import type { PrivateAddressAllowance } from "@toolmesh/tool-host";
import {
  HttpCredentialsSchema,
  callerScheme,
  declaredCredentials,
  outboundFetch,
  trustedHostsOf,
} from "@toolmesh/tool-host";
import type { ToolContext, ToolModule } from "@toolmesh/tool-host";
import type { ToolSourceKind } from "./tool-source.js";

/** HTTP methods a native tool may use. */
export const NATIVE_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"] as const;

/** An HTTP method a native tool may use. */
export type NativeMethod = (typeof NATIVE_METHODS)[number];

// RFC 9110 token: what a header name may be made of.
const HEADER_NAME = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;
const PLACEHOLDER = /\{([^{}]*)\}/g;
const FILE_EXTENSIONS = new Set([".yaml", ".yml"]);

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
  credentials: HttpCredentialsSchema.optional(),
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
  method: NativeMethod;
  apiUrl: string;
  placementOf(param: string): Placement;
  auth?: { header: string; value: string };
  /** The `Authorization` scheme the caller's own secret is sent with (`credentials: user-secret`). */
  userScheme?: string;
  endpoint: HttpEndpoint;
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
  const files = await toolFiles(dir, options);
  const allowed =
    options.allowedUrls === undefined ? undefined : new UrlAllowList(options.allowedUrls);
  const seen = new Map<string, string>(options.taken);
  const modules: ToolModule[] = [];
  for (const file of files) {
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
    modules.push(nativeToolModule(spec, file, env, allowed, options, fetchOf(spec, options)));
  }
  return modules;
}

/** `NAME.openapi.yaml|yml|json`: an OpenAPI document or a reference to one, not an HTTP tool. */
export function isOpenApiFile(file: string): boolean {
  return /\.openapi\.(?:ya?ml|json)$/i.test(file);
}

/** HTTP tools: the YAML files of `TOOLMESH_NATIVE_TOOLS_DIR`, one source per file. */
export const httpToolSources: ToolSourceKind = {
  kind: "http",
  async discover(settings) {
    const options: NativeToolsOptions = {
      missingOk: settings.nativeToolsDirOptional,
      ...(settings.maxResponseBytes === undefined
        ? {}
        : { maxResponseBytes: settings.maxResponseBytes }),
      ...(settings.allowedUrls === undefined ? {} : { allowedUrls: settings.allowedUrls }),
      ...(settings.allowPrivateAddresses === undefined
        ? {}
        : { allowPrivateAddresses: settings.allowPrivateAddresses }),
      ...(settings.trustConfiguredHosts === undefined
        ? {}
        : { trustConfiguredHosts: settings.trustConfiguredHosts }),
      ...(settings.fetch === undefined ? {} : { fetch: settings.fetch }),
    };
    const files = await toolFiles(settings.nativeToolsDir, options);
    const allowed =
      options.allowedUrls === undefined ? undefined : new UrlAllowList(options.allowedUrls);
    return files.map((file) => ({
      origin: file,
      async load() {
        const spec = await readToolFile(file);
        return [
          nativeToolModule(spec, file, settings.env, allowed, options, fetchOf(spec, options)),
        ];
      },
    }));
  },
};

/**
 * The guarded fetch of one tool: `options.fetch` when given, else {@link outboundFetch} trusting
 * the tool's own api_url host unless its file or `trustConfiguredHosts` says otherwise.
 */
function fetchOf(
  spec: z.output<typeof NativeToolFileSchema>,
  options: NativeToolsOptions,
): typeof globalThis.fetch {
  if (options.fetch !== undefined) return options.fetch;
  // api_url's host has no placeholder (checked at load), so no argument can change it.
  const host = new URL(spec.api_url.replace(PLACEHOLDER, "x"));
  return outboundFetch(
    options.allowPrivateAddresses,
    trustedHostsOf(host, spec.trust_configured_host, options.trustConfiguredHosts),
  );
}

/** The tool files of a folder, in file-name order; none for a missing optional folder. */
async function toolFiles(dir: string, options: NativeToolsOptions): Promise<string[]> {
  const root = resolve(dir);
  try {
    return (await readdir(root))
      .filter((f) => FILE_EXTENSIONS.has(extname(f)) && !isOpenApiFile(f))
      .sort()
      .map((f) => join(root, f));
  } catch (err) {
    if (options.missingOk === true && (err as NodeJS.ErrnoException).code === "ENOENT") return [];
    throw new ToolLoadError(`cannot read native tools folder ${root}: ${(err as Error).message}`, {
      cause: err,
    });
  }
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
    throw new ToolLoadError(`${file} is not a native tool: ${issuesLine(parsed.error)}`);
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

/**
 * The header a tool file's `auth` sets and its value, the secret read from `env` now; none
 * without `auth`. A secret missing from `env` fails the load.
 */
function configuredAuth(
  spec: z.output<typeof NativeToolFileSchema>,
  file: string,
  env: Readonly<Record<string, string | undefined>>,
): CompiledTool["auth"] {
  if (spec.auth === undefined) return undefined;
  const secret = env[spec.auth.env];
  if (secret === undefined || secret === "") {
    throw new ToolLoadError(
      `${file}: auth needs the environment variable ${spec.auth.env}, which is not set`,
    );
  }
  const bearer = spec.auth.method === "bearer";
  return {
    header: spec.auth.header ?? (bearer ? "Authorization" : "X-API-Key"),
    value: bearer ? `Bearer ${secret}` : secret,
  };
}

/** The tool module of one checked tool file, its handler holding what it needs compiled. */
function nativeToolModule(
  spec: z.output<typeof NativeToolFileSchema>,
  file: string,
  env: Readonly<Record<string, string | undefined>>,
  allowed: UrlAllowList | undefined,
  options: NativeToolsOptions,
  fetch: typeof globalThis.fetch,
): ToolModule {
  if (allowed !== undefined && !allowed.allows(new URL(spec.api_url.replace(PLACEHOLDER, "x")))) {
    throw new ToolLoadError(
      `${file}: api_url ${spec.api_url} is outside TOOLMESH_NATIVE_ALLOWED_URLS`,
    );
  }
  const auth = configuredAuth(spec, file, env);
  const userScheme = callerScheme(spec.credentials);
  if (userScheme !== undefined && auth?.header.toLowerCase() === "authorization") {
    throw new ToolLoadError(
      `${file}: credentials of type ${spec.credentials?.type} send the caller's credential as Authorization, which auth sets too: drop one, or give auth another header`,
    );
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
    method: spec.method,
    apiUrl: spec.api_url,
    placementOf: (param) =>
      placements.get(param) ?? (placeholders.has(param) ? { in: "path" } : fallback),
    ...(auth === undefined ? {} : { auth }),
    ...(userScheme === undefined ? {} : { userScheme }),
    endpoint: {
      tool: spec.name,
      allowed,
      credentialHeaders: [
        ...(auth === undefined ? [] : [auth.header]),
        ...(userScheme === undefined ? [] : ["authorization"]),
      ],
      secrets: spec.auth === undefined ? [] : [env[spec.auth.env] ?? ""],
      maxResponseBytes: options.maxResponseBytes ?? Defaults.maxMessageBytes,
      fetch,
    },
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
    ...(spec.credentials === undefined
      ? {}
      : { credentials: declaredCredentials(spec.credentials) }),
    origin: { api_url: spec.api_url, method: spec.method },
    handler: async (args, ctx) =>
      invokeHttp(endpointFor(tool, ctx), buildRequest(tool, args, ctx), ctx),
  };
}

/** The tool's endpoint, with the caller's secret among those never carried into results. */
function endpointFor(tool: CompiledTool, ctx: ToolContext): HttpEndpoint {
  return callerEndpoint(tool.endpoint, tool.userScheme, ctx);
}

/**
 * `endpoint` for one call of a tool sending the caller's secret (`scheme` set): the secret is
 * redacted from what the call returns, like the configured ones.
 */
export function callerEndpoint(
  endpoint: HttpEndpoint,
  scheme: string | undefined,
  ctx: ToolContext,
): HttpEndpoint {
  return scheme === undefined || ctx.credential === undefined
    ? endpoint
    : { ...endpoint, secrets: [...endpoint.secrets, ctx.credential] };
}

function buildRequest(
  tool: CompiledTool,
  args: Record<string, unknown>,
  ctx: ToolContext,
): HttpRequest {
  const pathValues = new Map<string, string>();
  const query: [string, string][] = [];
  const body: Record<string, unknown> = {};
  let hasBody = false;
  const headers = new Headers({ accept: DEFAULT_ACCEPT });
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
  const url = new URL(fillPath(tool.apiUrl, PLACEHOLDER, pathValues));
  for (const [name, value] of query) url.searchParams.append(name, value);
  setIdempotencyKey(headers, tool.method, ctx.idempotencyKey);
  const sendsBody =
    hasBody || tool.method === "POST" || tool.method === "PUT" || tool.method === "PATCH";
  if (sendsBody) headers.set("content-type", "application/json");
  // Set last: neither the model nor a preset can replace the configured credential.
  if (tool.auth !== undefined) headers.set(tool.auth.header, tool.auth.value);
  if (tool.userScheme !== undefined && ctx.credential !== undefined)
    headers.set("authorization", `${tool.userScheme} ${ctx.credential}`);
  return {
    method: tool.method,
    url,
    headers,
    body: sendsBody ? JSON.stringify(body) : undefined,
  };
}
