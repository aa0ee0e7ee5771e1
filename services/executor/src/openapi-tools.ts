import { readFile, readdir } from "node:fs/promises";
import { basename, dirname, extname, join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { parse as parseYaml } from "yaml";
import { z } from "zod";
import { Defaults, issuesLine, RetryPolicySchema } from "@toolmesh/protocol";
import type { HttpEndpoint } from "@toolmesh/tool-host";
import { UrlAllowList, invokeHttp } from "@toolmesh/tool-host";
import type { LoadLog } from "./tool-source.js";
import { ToolLoadError } from "./load-tools.js";
import { callerEndpoint, isOpenApiFile } from "./native-tools.js";
import type { Credential, OperationPlan, ParamPlan } from "./openapi-request.js";
import { CredentialStore, buildOperationRequest } from "./openapi-request.js";
import {
  HttpCredentialsSchema,
  callerScheme,
  declaredCredentials,
  outboundFetch,
  privateAddressCause,
  trustedHostsOf,
} from "@toolmesh/tool-host";
import type { ToolModule } from "@toolmesh/tool-host";
import type { ToolSource, ToolSourceKind, ToolSourceSettings } from "./tool-source.js";

const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;
const METHODS = ["get", "put", "post", "delete", "options", "head", "patch", "trace"] as const;
/** Methods whose repetition has the effect of one request (RFC 9110 §9.2.2). */
const IDEMPOTENT = new Set(["GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"]);
/** Largest OpenAPI document fetched by URL, in bytes. */
const MAX_DOCUMENT_BYTES = 64 * 1024 * 1024;
const EnvName = z.string().regex(ENV_NAME, "must be an environment variable name");

const FilterSchema = z.strictObject({
  tags: z.array(z.string()).optional(),
  operations: z.array(z.string()).optional(),
  methods: z.array(z.string().transform((m) => m.toUpperCase())).optional(),
});

/** How a security scheme's secret is found: environment variables named by the file. */
const SchemeAuthSchema = z.union([
  z.strictObject({ env: EnvName }),
  z.strictObject({ username_env: EnvName, password_env: EnvName }),
  z.strictObject({
    client_id_env: EnvName,
    client_secret_env: EnvName,
    scopes: z.array(z.string()).optional(),
    token_url: z.url({ protocol: /^https?$/ }).optional(),
  }),
]);

/**
 * A source file `NAME.openapi.yaml` that names a document and says how to serve it. Field
 * names follow the YAML convention (snake_case). Durations in ms.
 */
export const OpenApiSourceFileSchema = z.strictObject({
  /** The document: an `http(s)` URL, or a path relative to this file's folder. */
  spec: z.string().min(1),
  /** Tool names are `{prefix}.{operationId}`. Default the file's NAME. */
  prefix: z.string().min(1).max(64).optional(),
  /** Base URL of the API, instead of the document's first server. */
  server: z.url({ protocol: /^https?$/ }).optional(),
  /** Values of the server's variables, instead of their defaults. */
  server_variables: z.record(z.string(), z.string()).optional(),
  /** Only operations matching every listed criterion (a tag, an operationId, a method). */
  include: FilterSchema.optional(),
  /** Leaves out operations matching any listed criterion. */
  exclude: FilterSchema.optional(),
  /** Secrets by security scheme name, read from the executor's environment at load. */
  auth: z.record(z.string(), SchemeAuthSchema).optional(),
  /**
   * What every operation acts with (ADR 0061): `user-secret` sends the calling user's secret
   * for the tool as `Authorization`, after `scheme` (default `Bearer`).
   */
  credentials: HttpCredentialsSchema.optional(),
  timeout_ms: z.number().int().positive().optional(),
  retry: RetryPolicySchema.partial().strict().optional(),
  /** Apply `retry` to POST and PATCH too. Default false: they are attempted once. */
  retry_non_idempotent: z.boolean().default(false),
  /** Groups every tool of the document joins, besides one per tag. */
  groups: z.array(z.string().min(1)).optional(),
  /**
   * Whether connections to the exact host and port of the URLs this file configures — `spec`,
   * the base URL of each operation (`server`, else the document's server with its variables
   * filled at load) and OAuth2 token URLs — skip the private-address check. Redirects elsewhere
   * stay guarded. Default `TOOLMESH_TRUST_CONFIGURED_HOSTS` (true).
   */
  trust_configured_host: z.boolean().optional(),
});

/** A source file as written. */
export type OpenApiSourceFile = z.input<typeof OpenApiSourceFileSchema>;
type SourceOptions = z.output<typeof OpenApiSourceFileSchema>;

/** Something the tools of a document cannot do, found while reading it. */
export interface OpenApiWarning {
  /** The tool (or operation) it concerns; absent for the whole document. */
  tool?: string;
  message: string;
}

/** A document turned into tools. */
export interface OpenApiTools {
  tools: ToolModule[];
  warnings: OpenApiWarning[];
  /** Operations in the document before include/exclude. */
  operations: number;
}

/** Options of {@link openApiTools}: how to serve one document. */
export interface OpenApiToolsOptions {
  options: SourceOptions;
  /** Where the document came from: relative server URLs are resolved against it. */
  location: string;
  env: Readonly<Record<string, string | undefined>>;
  allowedUrls?: readonly string[];
  maxResponseBytes?: number;
  /** The fetch of requests to hosts no configured URL names. */
  fetch: typeof globalThis.fetch;
  /**
   * The fetch of requests to these URLs, fixed at load (base URLs, token URLs): one that may
   * trust their exact hosts. Never given a URL an argument can change. Default `fetch`.
   */
  fetchTrusting?: (urls: readonly URL[]) => typeof globalThis.fetch;
}

type Json = Record<string, unknown>;

/**
 * Reads an OpenAPI document (file path or URL; JSON or YAML) and resolves its references with
 * `@readme/openapi-parser` (internal ones only: a document does not make the executor read
 * other files or hosts). Circular references are left as `$ref` and pruned per tool.
 */
export async function readOpenApiDocument(
  spec: string,
  fetch: typeof globalThis.fetch,
): Promise<Json> {
  let text: string;
  if (/^https?:\/\//i.test(spec)) {
    let response: Response;
    try {
      response = await fetch(spec, {
        headers: { accept: "application/json, application/yaml;q=0.9, */*;q=0.5" },
        signal: AbortSignal.timeout(30_000),
      });
    } catch (err) {
      const cause = privateAddressCause(err) ?? (err as { cause?: unknown }).cause ?? err;
      throw new ToolLoadError(`cannot fetch OpenAPI document ${spec}: ${reasonOf(cause)}`, {
        cause: err,
      });
    }
    if (!response.ok) {
      throw new ToolLoadError(`cannot fetch OpenAPI document ${spec}: HTTP ${response.status}`);
    }
    const length = Number(response.headers.get("content-length") ?? "0");
    if (length > MAX_DOCUMENT_BYTES) {
      throw new ToolLoadError(
        `OpenAPI document ${spec} is larger than ${MAX_DOCUMENT_BYTES} bytes`,
      );
    }
    text = await response.text();
  } else {
    try {
      text = await readFile(spec, "utf8");
    } catch (err) {
      throw new ToolLoadError(`cannot read OpenAPI document ${spec}: ${reasonOf(err)}`, {
        cause: err,
      });
    }
  }
  let document: unknown;
  try {
    // JSON.parse is far faster on large documents; YAML is a superset for the rest.
    document = text.trimStart().startsWith("{") ? JSON.parse(text) : parseYaml(text);
  } catch (err) {
    throw new ToolLoadError(`${spec} is neither JSON nor YAML: ${reasonOf(err)}`, { cause: err });
  }
  if (typeof document !== "object" || document === null) {
    throw new ToolLoadError(`${spec} is not an OpenAPI document`);
  }
  const version = (document as Json).openapi;
  if ((document as Json).swagger !== undefined) {
    throw new ToolLoadError(
      `${spec} is a Swagger 2.0 document; convert it to OpenAPI 3 first (for example with swagger2openapi)`,
    );
  }
  if (typeof version !== "string" || !/^3\.[01]\./.test(version)) {
    throw new ToolLoadError(
      `${spec} is not an OpenAPI 3.0 or 3.1 document (openapi: ${String(version)})`,
    );
  }
  // Imported here: executors without OpenAPI documents do not load the parser at start.
  const { dereference } = await import("@readme/openapi-parser");
  try {
    return (await dereference(document as Parameters<typeof dereference>[0], {
      resolve: { external: false },
      dereference: { circular: "ignore" },
    })) as Json;
  } catch (err) {
    throw new ToolLoadError(`cannot resolve the references of ${spec}: ${reasonOf(err)}`, {
      cause: err,
    });
  }
}

/**
 * Turns a dereferenced OpenAPI 3.x document into tools, one per operation kept by the
 * filters, and lists what it cannot serve. Bad configuration (an unknown server variable
 * value, a secret missing from the environment, a server outside the allowed URLs) throws.
 */
export function openApiTools(document: Json, opts: OpenApiToolsOptions): OpenApiTools {
  const tools = new OpenApiToolsBuilder(document, opts);
  const paths = isObject(document.paths) ? document.paths : {};
  for (const [path, rawItem] of Object.entries(paths)) {
    if (!isObject(rawItem)) continue;
    for (const method of METHODS) {
      const operation = rawItem[method];
      if (isObject(operation)) tools.add(path, rawItem, method, operation);
    }
  }
  return tools.result();
}

/** An operation the filters keep, under the name of its tool. */
interface KeptOperation {
  operation: Json;
  path: string;
  /** Upper case, as sent. */
  method: string;
  operationId: string;
  tags: string[];
  /** The tool's name, `{prefix}.{operationId}`. */
  name: string;
}

/**
 * The tools of one document as its operations are added, the warnings met on the way, and what
 * every tool of the document shares: its security schemes' credentials and the caller's scheme.
 */
class OpenApiToolsBuilder {
  readonly #document: Json;
  readonly #opts: OpenApiToolsOptions;
  readonly #prefix: string;
  readonly #credentials: CredentialStore;
  readonly #userScheme: string | undefined;
  readonly #allowed: UrlAllowList | undefined;
  readonly #tools: ToolModule[] = [];
  readonly #warnings: OpenApiWarning[] = [];
  readonly #names = new Set<string>();
  #operations = 0;

  /** Reads the document-wide parts: webhooks (warned), security schemes and the caller's scheme. */
  constructor(document: Json, opts: OpenApiToolsOptions) {
    const { options } = opts;
    this.#document = document;
    this.#opts = opts;
    this.#prefix = options.prefix ?? "api";
    if (isObject(document.webhooks) && Object.keys(document.webhooks).length > 0) {
      this.#warn(
        "webhooks are not served: they are requests the API makes, not operations to call",
      );
    }
    const schemes = securitySchemes(document, options, opts.env, this.#warn);
    const tokenUrls = [...schemes.values()].flatMap((c) =>
      c.type === "oauth2" ? [c.tokenUrl] : [],
    );
    this.#credentials = new CredentialStore(schemes, this.#fetchTo(tokenUrls));
    this.#userScheme = callerScheme(options.credentials);
    if (this.#userScheme !== undefined && this.#credentials.sendsAuthorization()) {
      throw new ToolLoadError(
        `${opts.location}: credentials of type ${options.credentials?.type} send the caller's credential as Authorization, which a scheme in auth sends too: drop one`,
      );
    }
    this.#allowed = opts.allowedUrls === undefined ? undefined : new UrlAllowList(opts.allowedUrls);
  }

  /** Adds the tool of one operation, unless the filters leave it out or it cannot be served. */
  add(path: string, item: Json, method: (typeof METHODS)[number], operation: Json): void {
    const { options } = this.#opts;
    this.#operations++;
    const upper = method.toUpperCase();
    const operationId =
      typeof operation.operationId === "string" && operation.operationId !== ""
        ? operation.operationId
        : derivedOperationId(method, path);
    const tags = Array.isArray(operation.tags) ? operation.tags.map(String) : [];
    if (!kept({ tags, operationId, method: upper }, options)) return;
    const name = `${this.#prefix}.${operationId}`;
    if (name.length > 128) {
      this.#warn(`the tool name is longer than 128 characters; operation skipped`, name);
      return;
    }
    if (this.#names.has(name)) {
      this.#warn(`operationId ${operationId} is used twice; the first one is kept`, name);
      return;
    }
    if (isObject(operation.callbacks) && Object.keys(operation.callbacks).length > 0) {
      this.#warn("callbacks are not served; the operation is, without them", name);
    }
    const plan = planOperation(
      this.#document,
      item,
      operation,
      path,
      upper,
      name,
      this.#opts,
      this.#warn,
    );
    if (plan === undefined) return;
    this.#names.add(name);
    this.#tools.push(
      this.#toolOf({ operation, path, method: upper, operationId, tags, name }, plan),
    );
  }

  /** The tools added, with every warning and the count of the document's operations. */
  result(): OpenApiTools {
    return { tools: this.#tools, warnings: this.#warnings, operations: this.#operations };
  }

  /** The tool module of a kept operation: its description, its origin and its handler. */
  #toolOf(op: KeptOperation, plan: OperationPlan): ToolModule {
    const { options } = this.#opts;
    const { operation, path, method: upper, operationId, tags, name } = op;
    const credentials = this.#credentials;
    const userScheme = this.#userScheme;
    const security = credentials.requirementOf(
      operation.security ?? this.#document.security,
      (message) => this.#warn(message, name),
    );
    const http = this.#endpoint(name, plan.base);
    const idempotent = IDEMPOTENT.has(upper);
    const summary = typeof operation.summary === "string" ? operation.summary.trim() : "";
    const detail = typeof operation.description === "string" ? operation.description.trim() : "";
    const description =
      [summary, detail].filter((t) => t !== "").join("\n\n") || `${upper} ${path}`;
    const retry =
      idempotent || options.retry_non_idempotent
        ? options.retry
        : { ...options.retry, max_attempts: 1 };
    const groups = [...tags.map((t) => `${this.#prefix}.${t}`), ...(options.groups ?? [])];
    return {
      name,
      description,
      ...(summary === "" ? {} : { summary }),
      parameters: plan.schema,
      // Every param belongs to the API: none is a toolmesh system param.
      systemParams: [],
      ...(groups.length === 0 ? {} : { groups }),
      ...(options.timeout_ms === undefined ? {} : { timeoutMs: options.timeout_ms }),
      ...(retry === undefined ? {} : { retry }),
      kind: "native",
      ...(options.credentials === undefined
        ? {}
        : { credentials: declaredCredentials(options.credentials) }),
      annotations: {
        ...(summary === "" ? {} : { title: summary }),
        readOnlyHint: upper === "GET" || upper === "HEAD",
        ...(upper === "PUT" || upper === "DELETE" ? { idempotentHint: true } : {}),
        ...(operation.deprecated === true ? { deprecated: true } : {}),
      },
      origin: {
        openapi: this.#opts.location,
        operation_id: operationId,
        method: upper,
        path,
        server: plan.base.href,
        ...(tags.length === 0 ? {} : { tags }),
      },
      handler: async (args, ctx) => {
        const applied = await credentials.apply(security, ctx);
        const request = buildOperationRequest(plan, args, ctx, applied);
        if (userScheme !== undefined && ctx.credential !== undefined)
          request.headers.set("authorization", `${userScheme} ${ctx.credential}`);
        return invokeHttp(callerEndpoint(http, userScheme, ctx), request, ctx);
      },
    };
  }

  /** The endpoint of one tool; its base URL is fixed here, so its host may be trusted. */
  #endpoint(tool: string, base: URL): HttpEndpoint {
    return {
      tool,
      allowed: this.#allowed,
      // Authorization among them: the caller's secret, when sent, stays on its origin too.
      credentialHeaders: this.#credentials.headerNames(),
      secrets: this.#credentials.secrets(),
      maxResponseBytes: this.#opts.maxResponseBytes ?? Defaults.maxMessageBytes,
      fetch: this.#fetchTo([base]),
    };
  }

  /** The fetch of requests to URLs fixed at load, which may trust their exact hosts. */
  #fetchTo(urls: readonly URL[]): typeof globalThis.fetch {
    return this.#opts.fetchTrusting?.(urls) ?? this.#opts.fetch;
  }

  /** Notes something the document's tools cannot do; `tool` names the one it concerns. */
  readonly #warn = (message: string, tool?: string): void => {
    this.#warnings.push(tool === undefined ? { message } : { tool, message });
  };
}

function kept(
  op: { tags: string[]; operationId: string; method: string },
  options: SourceOptions,
): boolean {
  const matches = (f: z.output<typeof FilterSchema> | undefined): boolean[] =>
    f === undefined
      ? []
      : [
          ...(f.tags === undefined ? [] : [f.tags.some((t) => op.tags.includes(t))]),
          ...(f.operations === undefined ? [] : [f.operations.includes(op.operationId)]),
          ...(f.methods === undefined ? [] : [f.methods.includes(op.method)]),
        ];
  if (matches(options.include).some((m) => !m)) return false;
  return !matches(options.exclude).some((m) => m);
}

/** `get /pets/{petId}` → `get_pets_petId`: a name for an operation without an operationId. */
function derivedOperationId(method: string, path: string): string {
  const words = path.split(/[^A-Za-z0-9]+/).filter((w) => w !== "");
  return [method, ...words].join("_");
}

/**
 * The request plan of an operation: the tool's input schema (parameters of every location and
 * the JSON body as one object schema) and where each argument goes. Undefined, with a warning,
 * when the operation cannot be served.
 */
function planOperation(
  document: Json,
  item: Json,
  operation: Json,
  path: string,
  method: string,
  name: string,
  opts: OpenApiToolsOptions,
  warn: (message: string, tool?: string) => void,
): OperationPlan | undefined {
  const openapi30 = String(document.openapi).startsWith("3.0");
  const pruned = new Set<string>();
  const input: InputSchema = {
    properties: {},
    required: [],
    schemaOf: (value, drop) => inputSchema(value, { openapi30, drop, pruned }),
    warn: (message) => warn(message, name),
  };
  const byKey = new Map<string, Json>();
  for (const p of [
    ...(Array.isArray(item.parameters) ? (item.parameters as unknown[]) : []),
    ...(Array.isArray(operation.parameters) ? (operation.parameters as unknown[]) : []),
  ]) {
    if (isObject(p) && typeof p.name === "string" && typeof p.in === "string") {
      byKey.set(`${p.in}:${p.name}`, p);
    }
  }
  const params: ParamPlan[] = [];
  for (const p of byKey.values()) {
    const param = planParameter(p, input);
    if (param === undefined) return undefined;
    if (param !== "ignored") params.push(param);
  }
  const body = planBody(operation.requestBody, input);
  if (body === "unserved") return undefined;
  for (const ref of pruned) {
    warn(`the schema ${ref} refers to itself; below that point any JSON value is accepted`, name);
  }
  const base = serverUrl(document, item, operation, opts, name);
  const { properties, required } = input;
  return {
    method,
    base,
    path,
    params,
    ...(body === undefined ? {} : { body }),
    schema: {
      type: "object",
      properties,
      ...(required.length === 0 ? {} : { required: [...new Set(required)] }),
    },
  };
}

/** The tool's input schema as an operation's parameters and body are added to it. */
interface InputSchema {
  properties: Json;
  required: string[];
  schemaOf(value: unknown, drop: "readOnly" | "none"): Json;
  /** Warns about the operation being planned. */
  warn(message: string): void;
}

/**
 * Adds one parameter to the input schema and says where its argument goes: `ignored` for a
 * header toolmesh sets itself, undefined (warned) when the operation cannot be served.
 */
function planParameter(p: Json, input: InputSchema): ParamPlan | "ignored" | undefined {
  const { properties, required } = input;
  const location = p.in as string;
  const paramName = p.name as string;
  if (!["path", "query", "header", "cookie"].includes(location)) {
    input.warn(`parameter ${paramName} is in "${location}", which OpenAPI 3 does not define`);
    return undefined;
  }
  if (
    location === "header" &&
    ["accept", "content-type", "authorization"].includes(paramName.toLowerCase())
  ) {
    return "ignored"; // OpenAPI says such parameters are ignored: toolmesh sets these headers
  }
  let raw: unknown = p.schema;
  let json = false;
  if (raw === undefined && isObject(p.content)) {
    const [mediaType, media] = Object.entries(p.content)[0] ?? [];
    if (mediaType === undefined || !isJsonMediaType(mediaType)) {
      input.warn(
        `parameter ${paramName} is sent as ${String(mediaType)}, which is not supported; operation skipped`,
      );
      return undefined;
    }
    raw = isObject(media) ? media.schema : undefined;
    json = true;
  }
  const property = unusedName(paramName, location, properties);
  const schema = input.schemaOf(raw ?? {}, "none");
  if (typeof p.description === "string" && schema.description === undefined) {
    schema.description = p.description;
  }
  if (p.deprecated === true) schema.deprecated = true;
  properties[property] = schema;
  if (p.required === true || location === "path") required.push(property);
  return {
    property,
    name: paramName,
    in: location as ParamPlan["in"],
    style:
      typeof p.style === "string"
        ? p.style
        : location === "query" || location === "cookie"
          ? "form"
          : "simple",
    explode:
      typeof p.explode === "boolean"
        ? p.explode
        : (p.style ?? (location === "query" || location === "cookie" ? "form" : "simple")) ===
          "form",
    json,
  };
}

/**
 * Adds the request body to the input schema: its properties when it is a plain object whose
 * names are free, else one `body` property. Undefined when there is none (or it is not JSON and
 * optional, warned), `unserved` (warned) when a required body is not JSON.
 */
function planBody(
  requestBody: unknown,
  input: InputSchema,
): OperationPlan["body"] | "unserved" | undefined {
  if (!isObject(requestBody) || !isObject(requestBody.content)) return undefined;
  const { properties, required } = input;
  const mediaTypes = Object.keys(requestBody.content);
  const mediaType = mediaTypes.find(isJsonMediaType);
  if (mediaType === undefined) {
    const what = mediaTypes.join(", ") || "no media type";
    if (requestBody.required === true) {
      input.warn(
        `the request body is ${what}, which is not supported (JSON only); operation skipped`,
      );
      return "unserved";
    }
    input.warn(
      `the request body is ${what}, which is not supported (JSON only); the operation is served without a body`,
    );
    return undefined;
  }
  const media = requestBody.content[mediaType];
  const schema = input.schemaOf(isObject(media) ? (media.schema ?? {}) : {}, "readOnly");
  const bodyRequired = requestBody.required === true;
  const flat =
    schema.type === "object" &&
    isObject(schema.properties) &&
    !["allOf", "anyOf", "oneOf", "additionalProperties", "patternProperties"].some(
      (k) => k in schema,
    ) &&
    Object.keys(schema.properties).every((k) => !(k in properties));
  if (flat) {
    const bodyProps = schema.properties as Json;
    Object.assign(properties, bodyProps);
    if (bodyRequired && Array.isArray(schema.required)) {
      required.push(...(schema.required as string[]).filter((r) => r in bodyProps));
    }
    return { mediaType, properties: Object.keys(bodyProps) };
  }
  const property = unusedName("body", "body", properties);
  if (typeof requestBody.description === "string" && schema.description === undefined) {
    schema.description = requestBody.description;
  }
  properties[property] = schema;
  if (bodyRequired) required.push(property);
  return { mediaType, property };
}

/** The property name of a parameter: its own, else `{in}_{name}` when a name is taken. */
function unusedName(name: string, location: string, properties: Json): string {
  if (!(name in properties)) return name;
  let candidate = `${location}_${name}`;
  for (let i = 2; candidate in properties; i++) candidate = `${location}_${name}_${i}`;
  return candidate;
}

function isJsonMediaType(mediaType: string): boolean {
  const type = mediaType.split(";", 1)[0]?.trim().toLowerCase() ?? "";
  return type === "application/json" || type.endsWith("+json") || type === "*/*";
}

/**
 * A copy of an OpenAPI schema fit for the tool's input: readOnly properties left out (of a
 * request body), circular `$ref`s replaced by `{}`, and for OpenAPI 3.0 `nullable` and the
 * boolean `exclusiveMinimum`/`exclusiveMaximum` turned into JSON Schema 2020-12.
 */
function inputSchema(
  value: unknown,
  ctx: { openapi30: boolean; drop: "readOnly" | "none"; pruned: Set<string> },
): Json {
  const copy = (v: unknown, depth: number): unknown => {
    if (Array.isArray(v)) return v.map((x) => copy(x, depth + 1));
    if (!isObject(v)) return v;
    if (typeof v.$ref === "string") {
      ctx.pruned.add(v.$ref);
      return {};
    }
    if (depth > 64) return {};
    const out: Json = {};
    for (const [key, child] of Object.entries(v)) {
      if (
        key.startsWith("x-") ||
        key === "xml" ||
        key === "externalDocs" ||
        key === "discriminator"
      ) {
        continue;
      }
      if (key === "properties" && isObject(child)) {
        const props: Json = {};
        for (const [prop, schema] of Object.entries(child)) {
          if (ctx.drop === "readOnly" && isObject(schema) && schema.readOnly === true) continue;
          props[prop] = copy(schema, depth + 1);
        }
        out.properties = props;
        continue;
      }
      out[key] = copy(child, depth + 1);
    }
    if (ctx.drop === "readOnly" && Array.isArray(out.required) && isObject(out.properties)) {
      const props = out.properties;
      const readOnly = isObject(v.properties) ? v.properties : {};
      out.required = (out.required as string[]).filter(
        (r) => r in props || !(isObject(readOnly[r]) && readOnly[r].readOnly === true),
      );
    }
    if (ctx.openapi30) {
      if (out.nullable === true) {
        if (typeof out.type === "string") out.type = [out.type, "null"];
        else if (Array.isArray(out.enum) && !out.enum.includes(null))
          out.enum = [...(out.enum as unknown[]), null];
      }
      delete out.nullable;
      for (const [flag, bound] of [
        ["exclusiveMinimum", "minimum"],
        ["exclusiveMaximum", "maximum"],
      ] as const) {
        if (out[flag] === true && typeof out[bound] === "number") {
          out[flag] = out[bound];
          delete out[bound];
        } else if (typeof out[flag] === "boolean") delete out[flag];
      }
    }
    return out;
  };
  const result = copy(value, 0);
  return isObject(result) ? result : {};
}

/** The operation's base URL: the configured server, else the first of the operation's, path's or document's. */
function serverUrl(
  document: Json,
  item: Json,
  operation: Json,
  opts: OpenApiToolsOptions,
  tool: string,
): URL {
  const { options } = opts;
  let text: string;
  if (options.server !== undefined) {
    text = options.server;
  } else {
    const servers = [operation.servers, item.servers, document.servers].find(
      (s) => Array.isArray(s) && s.length > 0,
    ) as unknown[] | undefined;
    const server = isObject(servers?.[0]) ? servers[0] : { url: "/" };
    text = typeof server.url === "string" ? server.url : "/";
    const variables = isObject(server.variables) ? server.variables : {};
    text = text.replace(/\{([^{}]+)\}/g, (_, variable: string) => {
      const declared = variables[variable];
      const chosen =
        options.server_variables?.[variable] ?? (isObject(declared) ? declared.default : undefined);
      if (typeof chosen !== "string") {
        throw new ToolLoadError(
          `${tool}: server variable {${variable}} has no value; set server_variables.${variable}`,
        );
      }
      if (isObject(declared) && Array.isArray(declared.enum) && !declared.enum.includes(chosen)) {
        throw new ToolLoadError(
          `${tool}: server variable ${variable}=${JSON.stringify(chosen)} is not one of ${declared.enum.map((e) => JSON.stringify(e)).join(", ")}`,
        );
      }
      return chosen;
    });
  }
  let url: URL;
  if (URL.canParse(text)) url = new URL(text);
  else if (/^https?:\/\//i.test(opts.location) && URL.canParse(text, opts.location)) {
    url = new URL(text, opts.location);
  } else {
    throw new ToolLoadError(
      `${tool}: the server URL ${JSON.stringify(text)} is relative and the document is a file; set server in the source file`,
    );
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw new ToolLoadError(`${tool}: the server URL ${url.href} is not http(s)`);
  }
  if (url.username !== "" || url.password !== "") {
    throw new ToolLoadError(`${tool}: the server URL must not hold credentials; use auth`);
  }
  if (opts.allowedUrls !== undefined && !new UrlAllowList(opts.allowedUrls).allows(url)) {
    throw new ToolLoadError(
      `${tool}: the server ${url.href} is outside TOOLMESH_NATIVE_ALLOWED_URLS`,
    );
  }
  return url;
}

/** The document's security schemes with the secrets the source file names, read now. */
function securitySchemes(
  document: Json,
  options: SourceOptions,
  env: Readonly<Record<string, string | undefined>>,
  warn: (message: string) => void,
): Map<string, Credential> {
  const components = isObject(document.components) ? document.components : {};
  const schemes = isObject(components.securitySchemes) ? components.securitySchemes : {};
  const out = new Map<string, Credential>();
  for (const scheme of Object.keys(options.auth ?? {})) {
    if (!(scheme in schemes)) {
      throw new ToolLoadError(`auth.${scheme}: the document has no security scheme ${scheme}`);
    }
  }
  for (const [scheme, raw] of Object.entries(schemes)) {
    if (!isObject(raw)) continue;
    const credential = schemeCredential(scheme, raw, options.auth?.[scheme], env, warn);
    if (credential !== undefined) out.set(scheme, credential);
  }
  return out;
}

/**
 * One security scheme's credential, its secrets read from `env`. Undefined when the source file
 * gives it none, or (warned) when toolmesh cannot send it: its operations go without it.
 */
function schemeCredential(
  scheme: string,
  raw: Json,
  auth: z.output<typeof SchemeAuthSchema> | undefined,
  env: Readonly<Record<string, string | undefined>>,
  warn: (message: string) => void,
): Credential | undefined {
  const type = raw.type;
  if (type === "apiKey" && (raw.in === "header" || raw.in === "query" || raw.in === "cookie")) {
    if (auth === undefined) return undefined;
    if (!("env" in auth)) {
      throw new ToolLoadError(`auth.${scheme}: an API key is given as { env: VARIABLE }`);
    }
    return {
      type: "apiKey",
      in: raw.in,
      name: String(raw.name),
      value: secretOf(env, auth.env, scheme),
    };
  }
  if (type === "http" && typeof raw.scheme === "string" && raw.scheme.toLowerCase() === "bearer") {
    if (auth === undefined) return undefined;
    if (!("env" in auth)) {
      throw new ToolLoadError(`auth.${scheme}: a bearer token is given as { env: VARIABLE }`);
    }
    return { type: "bearer", token: secretOf(env, auth.env, scheme) };
  }
  if (type === "http" && typeof raw.scheme === "string" && raw.scheme.toLowerCase() === "basic") {
    if (auth === undefined) return undefined;
    if (!("username_env" in auth)) {
      throw new ToolLoadError(
        `auth.${scheme}: basic credentials are given as { username_env, password_env }`,
      );
    }
    return {
      type: "basic",
      username: secretOf(env, auth.username_env, scheme),
      password: secretOf(env, auth.password_env, scheme),
    };
  }
  if (type === "oauth2" && isObject(raw.flows) && isObject(raw.flows.clientCredentials)) {
    if (auth === undefined) return undefined;
    if (!("client_id_env" in auth)) {
      throw new ToolLoadError(
        `auth.${scheme}: OAuth2 client credentials are given as { client_id_env, client_secret_env }`,
      );
    }
    const tokenUrl = auth.token_url ?? raw.flows.clientCredentials.tokenUrl;
    if (typeof tokenUrl !== "string" || !URL.canParse(tokenUrl)) {
      throw new ToolLoadError(
        `auth.${scheme}: the token URL ${String(tokenUrl)} is not absolute; set token_url`,
      );
    }
    return {
      type: "oauth2",
      tokenUrl: new URL(tokenUrl),
      clientId: secretOf(env, auth.client_id_env, scheme),
      clientSecret: secretOf(env, auth.client_secret_env, scheme),
      scopes: auth.scopes ?? [],
    };
  }
  const why =
    type === "oauth2"
      ? "only the OAuth2 client-credentials flow is supported"
      : type === "http"
        ? `HTTP authentication "${String(raw.scheme)}" is not supported (basic and bearer are)`
        : `type ${String(type)} is not supported`;
  warn(`security scheme ${scheme}: ${why}; its operations are called without it`);
  return undefined;
}

/** The value of an environment variable a scheme's `auth` names; unset or empty fails the load. */
function secretOf(
  env: Readonly<Record<string, string | undefined>>,
  variable: string,
  scheme: string,
): string {
  const value = env[variable];
  if (value === undefined || value === "") {
    throw new ToolLoadError(
      `auth.${scheme} needs the environment variable ${variable}, which is not set`,
    );
  }
  return value;
}

/** Reads a source file: an OpenAPI document itself, or `spec:` and options. */
export async function readOpenApiSourceFile(
  file: string,
): Promise<{ options: SourceOptions; spec: string; inline?: Json }> {
  const name = basename(file).replace(/\.openapi\.(?:ya?ml|json)$/i, "");
  let text: string;
  try {
    text = await readFile(file, "utf8");
  } catch (err) {
    throw new ToolLoadError(`cannot read ${file}: ${reasonOf(err)}`, { cause: err });
  }
  let content: unknown;
  try {
    content = extname(file) === ".json" ? JSON.parse(text) : parseYaml(text);
  } catch (err) {
    throw new ToolLoadError(
      `${file} is not readable ${extname(file) === ".json" ? "JSON" : "YAML"}: ${reasonOf(err)}`,
      { cause: err },
    );
  }
  if (isObject(content) && (content.openapi !== undefined || content.swagger !== undefined)) {
    return { options: OpenApiSourceFileSchema.parse({ spec: file, prefix: name }), spec: file };
  }
  const parsed = OpenApiSourceFileSchema.safeParse(content);
  if (!parsed.success) {
    throw new ToolLoadError(
      `${file} is neither an OpenAPI document nor an OpenAPI source (spec: URL or file): ${issuesLine(parsed.error)}`,
    );
  }
  const spec = /^https?:\/\//i.test(parsed.data.spec)
    ? parsed.data.spec
    : resolve(dirname(file), parsed.data.spec);
  return { options: { ...parsed.data, prefix: parsed.data.prefix ?? name }, spec };
}

/** One OpenAPI source: a file of the HTTP tools folder. */
function openApiSource(file: string, settings: ToolSourceSettings, log: LoadLog): ToolSource {
  return {
    origin: file,
    async load() {
      const { options, spec } = await readOpenApiSourceFile(file);
      // One guarded fetch per set of trusted hosts, shared by the tools that call them.
      const guards = new Map<string, typeof globalThis.fetch>();
      const fetchTrusting = (urls: readonly (string | URL)[]): typeof globalThis.fetch => {
        if (settings.fetch !== undefined) return settings.fetch;
        const hosts = [
          ...new Set(
            urls.flatMap((url) =>
              trustedHostsOf(url, options.trust_configured_host, settings.trustConfiguredHosts),
            ),
          ),
        ].sort();
        const key = hosts.join(" ");
        let guarded = guards.get(key);
        if (guarded === undefined) {
          guarded = outboundFetch(settings.allowPrivateAddresses, hosts);
          guards.set(key, guarded);
        }
        return guarded;
      };
      const fetch = fetchTrusting([]);
      // The operator wrote spec's URL; a relative server URL resolves against it at load.
      const document = await readOpenApiDocument(
        spec,
        fetchTrusting(/^https?:\/\//i.test(spec) ? [spec] : []),
      );
      let result: OpenApiTools;
      try {
        result = openApiTools(document, {
          options,
          location: /^https?:\/\//i.test(spec) ? spec : pathToFileURL(spec).href,
          env: settings.env,
          fetch,
          fetchTrusting,
          ...(settings.allowedUrls === undefined ? {} : { allowedUrls: settings.allowedUrls }),
          ...(settings.maxResponseBytes === undefined
            ? {}
            : { maxResponseBytes: settings.maxResponseBytes }),
        });
      } catch (err) {
        if (err instanceof ToolLoadError)
          throw new ToolLoadError(`${file}: ${err.message}`, { cause: err });
        throw err;
      }
      for (const w of result.warnings) {
        log.warn(
          { source: file, ...(w.tool === undefined ? {} : { tool: w.tool }) },
          `OpenAPI: ${w.message}`,
        );
      }
      return result.tools;
    },
  };
}

/** OpenAPI documents: `NAME.openapi.yaml|yml|json` files of `TOOLMESH_NATIVE_TOOLS_DIR`. */
export const openApiToolSources: ToolSourceKind = {
  kind: "openapi",
  async discover(settings, log) {
    const root = resolve(settings.nativeToolsDir);
    let entries: string[];
    try {
      entries = (await readdir(root)).filter(isOpenApiFile).sort();
    } catch (err) {
      if (settings.nativeToolsDirOptional && (err as NodeJS.ErrnoException).code === "ENOENT") {
        return [];
      }
      throw new ToolLoadError(`cannot read native tools folder ${root}: ${reasonOf(err)}`, {
        cause: err,
      });
    }
    return entries.map((entry) => openApiSource(join(root, entry), settings, log));
  },
};

function isObject(value: unknown): value is Json {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function reasonOf(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
