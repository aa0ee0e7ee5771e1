import { readFile, readdir } from "node:fs/promises";
import { extname, isAbsolute, join, resolve } from "node:path";
import { parse as parseYaml } from "yaml";
import { z } from "zod";
import { Defaults, issuesLine, RetryPolicySchema } from "@toolmesh/protocol";
import { HttpCredentialsSchema } from "@toolmesh/tool-host";

const SERVER_FILE_EXTENSIONS = new Set([".yaml", ".yml", ".json"]);

/** Environment variable names as shells accept them. */
const envVarName = z
  .string()
  .regex(/^[A-Za-z_][A-Za-z0-9_]*$/, "must be an environment variable name");

/**
 * A value that may be a secret: a string, the value of one of the bridge's environment
 * variables (`{ env: VAR }`), or the content of a file such as a mounted secret
 * (`{ file: /path }`, trailing newlines removed). A string may embed them as `${env:VAR}` and
 * `${file:/path}` (e.g. a database URL around its password). Read at each (re)connect.
 */
export const SecretValueSchema = z.union([
  z.string(),
  z.strictObject({ env: envVarName }),
  z.strictObject({ file: z.string().min(1) }),
]);

/** A value that may be a secret; see {@link SecretValueSchema}. */
export type SecretValue = z.infer<typeof SecretValueSchema>;

/**
 * The credential sent as a header on every HTTP request (an MCP API key).
 * `api_key` sends the secret as it is in `header` (default `X-API-Key`); `bearer` sends
 * `Bearer <secret>` in `header` (default `Authorization`).
 */
export const AuthSchema = z
  .strictObject({
    type: z.enum(["api_key", "bearer"]),
    header: z
      .string()
      .regex(/^[A-Za-z0-9!#$%&'*+.^_`|~-]+$/, "must be an HTTP header name")
      .optional(),
    env: envVarName.optional(),
    file: z.string().min(1).optional(),
  })
  .refine((a) => (a.env === undefined) !== (a.file === undefined), {
    message: "give exactly one of env (a variable name) or file (a path)",
  });

/** A tool declared in the file, so a lazy server's catalog exists before it first starts. */
export const DeclaredToolSchema = z.strictObject({
  name: z.string().min(1),
  description: z.string().default(""),
  inputSchema: z.record(z.string(), z.unknown()).default({ type: "object" }),
  annotations: z.record(z.string(), z.unknown()).optional(),
});

/** How quickly a server that went away is connected again. Durations in ms. */
const ReconnectSchema = z.strictObject({
  /** First delay after a crash or a failed connect. Default 250. */
  initial_delay_ms: z.number().int().nonnegative().default(250),
  /** Longest delay; each failure in a row doubles the previous one. Default 30 000. */
  max_delay_ms: z.number().int().positive().default(30_000),
});

const common = {
  /** Prefix of every tool of the server: `<name>.<tool>`. Also the registry owner suffix. */
  name: z
    .string()
    .regex(/^[A-Za-z0-9_-]{1,64}$/, "must be 1-64 characters of A-Z, a-z, 0-9, _ and -"),
  /** Start the server on the first call instead of at bridge start. */
  lazy: z.boolean().default(false),
  tools: z.array(DeclaredToolSchema).optional(),
  /** Per-attempt timeout of the server's tools, in ms. */
  timeout_ms: z.number().int().positive().optional(),
  /** Bound of `initialize` plus the first `tools/list`, in ms. */
  connect_timeout_ms: z.number().int().positive().default(10_000),
  retry: RetryPolicySchema.partial().optional(),
  groups: z.array(z.string().min(1)).optional(),
  reconnect: ReconnectSchema.prefault({}),
  /** What a JSON-RPC internal error (-32603) of a call is: final (`fail`) or retried. */
  internal_error: z.enum(["fail", "retry"]).default("fail"),
  /** Which form of a result with `structuredContent` reaches the model; see result.ts. */
  structured_content: z.enum(["auto", "content", "structured"]).default("auto"),
  /** Serve only tool definitions approved by hash; a changed one waits for approval. */
  pin_tools: z.boolean().default(false),
  /**
   * What the server's tools act with (docs/credentials.md): `user-secret` and `token-exchange`
   * send the calling user's credential as each `tools/call` request's `Authorization`; the
   * session's other requests keep the configured headers. Over HTTP only.
   */
  credentials: HttpCredentialsSchema.optional(),
};

const StdioServerSchema = z.strictObject({
  ...common,
  transport: z.literal("stdio"),
  /** A path with a `/` is resolved against the server file's folder; a bare name uses PATH. */
  command: z.string().min(1),
  /** Seen by every user of the host in `ps`: secrets belong in `env` where the server allows. */
  args: z.array(SecretValueSchema).default([]),
  /** Added to a minimal inherited environment (HOME, PATH, …), never the bridge's whole one. */
  env: z.record(envVarName, SecretValueSchema).default({}),
  /** Relative to the server file's folder, which is also the default. */
  cwd: z.string().min(1).optional(),
  /** A lazy server with no call for this long is stopped, in ms. */
  idle_timeout_ms: z.number().int().positive().optional(),
});

const remote = {
  url: z.url({ protocol: /^https?$/, error: "must be an http(s) URL" }),
  headers: z.record(z.string().min(1), SecretValueSchema).default({}),
  auth: AuthSchema.optional(),
  /**
   * Whether connections to `url`'s own host skip the private-address check (the operator wrote
   * it; redirects to other hosts stay guarded). Default `TOOLMESH_TRUST_CONFIGURED_HOSTS` (true).
   */
  trust_configured_host: z.boolean().optional(),
};

const HttpServerSchema = z.strictObject({
  ...common,
  ...remote,
  transport: z.literal("http"),
});

const SseServerSchema = z.strictObject({
  ...common,
  ...remote,
  transport: z.literal("sse"),
});

/** One MCP server file (`tools/mcp/<file>.yaml`). */
export const McpServerConfigSchema = z
  .discriminatedUnion("transport", [StdioServerSchema, HttpServerSchema, SseServerSchema])
  .superRefine((server, ctx) => {
    if (server.tools !== undefined && !server.lazy) {
      ctx.addIssue({
        code: "custom",
        path: ["tools"],
        message: "declared tools are for lazy servers (lazy: true)",
      });
    }
    if (server.transport === "stdio" && server.idle_timeout_ms !== undefined && !server.lazy) {
      ctx.addIssue({
        code: "custom",
        path: ["idle_timeout_ms"],
        message: "only a lazy server (lazy: true) is stopped when idle",
      });
    }
    const credentials = server.credentials?.type;
    if (server.transport === "stdio" && credentials !== undefined && credentials !== "service") {
      ctx.addIssue({
        code: "custom",
        path: ["credentials"],
        message: `credentials of type ${credentials} need a server over HTTP (transport http or sse): one stdio process serves every caller`,
      });
    }
    if (server.reconnect.max_delay_ms < server.reconnect.initial_delay_ms) {
      ctx.addIssue({
        code: "custom",
        path: ["reconnect", "max_delay_ms"],
        message: "must be at least initial_delay_ms",
      });
    }
  });

/** A parsed MCP server file, defaults applied. */
export type McpServerConfig = z.output<typeof McpServerConfigSchema>;

/** A server configuration and the file it came from. */
export interface LoadedServer {
  config: McpServerConfig;
  file: string;
}

/** A server file that cannot be used; the message names the file. */
export class McpConfigError extends Error {
  override readonly name = "McpConfigError";
}

/** Options of {@link loadMcpServers}. */
export interface LoadServersOptions {
  /** A missing folder is no servers rather than an error. Default: only for `Defaults.mcpDir`. */
  optional?: boolean;
  /** The environment `{ env: VAR }` secrets are read from; checked here so typos fail at start. */
  env: Readonly<Record<string, string | undefined>>;
}

/**
 * Reads every server file of a folder (not recursive, in file-name order): `*.yaml`/`*.yml`
 * with one MCP server each, and `*.json` in the `mcpServers` format of Claude Desktop, Cursor
 * and VS Code with any number of them. Relative `command` paths and `cwd` are resolved
 * against the folder. A file that is not valid, two servers with the same `name`, or a secret
 * variable that is not set fails the load with a message naming the file.
 */
export async function loadMcpServers(
  dir: string,
  options: LoadServersOptions,
): Promise<LoadedServer[]> {
  const root = resolve(dir);
  const optional = options.optional ?? dir === Defaults.mcpDir;
  let entries: string[];
  try {
    entries = (await readdir(root)).filter((f) => SERVER_FILE_EXTENSIONS.has(extname(f))).sort();
  } catch (err) {
    if (optional && (err as NodeJS.ErrnoException).code === "ENOENT") return [];
    throw new McpConfigError(`cannot read MCP server folder ${root}: ${(err as Error).message}`, {
      cause: err,
    });
  }
  const loaded: LoadedServer[] = [];
  const byName = new Map<string, string>();
  for (const entry of entries) {
    const file = join(root, entry);
    const text = await readFile(file, "utf8");
    const configs =
      extname(entry) === ".json"
        ? parseClientConfigFile(text, file)
        : [parseServerFile(text, file)];
    for (const parsed of configs) {
      const config = withPaths(parsed, root);
      const previous = byName.get(config.name);
      if (previous !== undefined) {
        throw new McpConfigError(
          `${file}: server name "${config.name}" is already used by ${previous}`,
        );
      }
      for (const variable of secretVariables(config)) {
        if (options.env[variable] === undefined || options.env[variable] === "") {
          throw new McpConfigError(
            `${file}: environment variable ${variable} (a secret of server "${config.name}") is not set`,
          );
        }
      }
      byName.set(config.name, file);
      loaded.push({ config, file });
    }
  }
  return loaded;
}

/** A stdio server with its `command` path and `cwd` resolved against the file's folder. */
function withPaths(config: McpServerConfig, folder: string): McpServerConfig {
  if (config.transport !== "stdio") return config;
  const command =
    /[/\\]/.test(config.command) && !isAbsolute(config.command)
      ? resolve(folder, config.command)
      : config.command;
  return { ...config, command, cwd: resolve(folder, config.cwd ?? ".") };
}

/** Parses the text of one server file; `file` names it in errors. */
export function parseServerFile(text: string, file: string): McpServerConfig {
  let raw: unknown;
  try {
    raw = parseYaml(text);
  } catch (err) {
    throw new McpConfigError(`${file} is not valid YAML: ${(err as Error).message}`, {
      cause: err,
    });
  }
  const parsed = McpServerConfigSchema.safeParse(raw);
  if (!parsed.success) {
    throw new McpConfigError(`${file} is not a valid MCP server file: ${issuesLine(parsed.error)}`);
  }
  return parsed.data;
}

/** Keys other MCP clients write into a server entry that mean nothing to the bridge. */
const FOREIGN_KEYS = [
  "type",
  "disabled",
  "autoApprove",
  "alwaysAllow",
  "disabledTools",
  "description",
  "timeout",
];

/** The `type` values other clients use for remote servers, as bridge transports. */
const REMOTE_TYPES: Record<string, "http" | "sse"> = {
  http: "http",
  "streamable-http": "http",
  streamableHttp: "http",
  streamable_http: "http",
  sse: "sse",
};

/**
 * Parses a `mcpServers` JSON file as Claude Desktop, Cursor and VS Code (`servers`) write it:
 * each entry with `command` (`args`, `env`, `cwd`) is a stdio server; one with `url`
 * (`headers`) a streamable HTTP server, or legacy SSE when its `type` is `sse` or, without a
 * `type`, its path ends in `/sse`. The entry's key is the server name (characters outside
 * `A-Z a-z 0-9 _ -` become `_`); entries with `disabled: true` are skipped. Other bridge
 * options (`timeout_ms`, `lazy`, `pin_tools`, …) may be added to an entry.
 */
export function parseClientConfigFile(text: string, file: string): McpServerConfig[] {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (err) {
    throw new McpConfigError(`${file} is not valid JSON: ${(err as Error).message}`, {
      cause: err,
    });
  }
  const top = (typeof raw === "object" && raw !== null ? raw : {}) as Record<string, unknown>;
  const key = "mcpServers" in top ? "mcpServers" : "servers" in top ? "servers" : undefined;
  const servers = key === undefined ? undefined : top[key];
  if (typeof servers !== "object" || servers === null || Array.isArray(servers)) {
    throw new McpConfigError(
      `${file} is not an MCP server file: expected an object "mcpServers" (or "servers") of servers by name`,
    );
  }
  const configs: McpServerConfig[] = [];
  for (const [name, value] of Object.entries(servers as Record<string, unknown>)) {
    const where = `${file}: ${key}.${name}`;
    if (typeof value !== "object" || value === null || Array.isArray(value)) {
      throw new McpConfigError(`${where} must be an object`);
    }
    const entry = value as Record<string, unknown>;
    if (entry.disabled === true) continue;
    const type = typeof entry.type === "string" ? entry.type : undefined;
    let transport: "stdio" | "http" | "sse";
    if (entry.command !== undefined) transport = "stdio";
    else if (typeof entry.url === "string") {
      transport =
        type === undefined
          ? /\/sse\/?$/.test(new URL(entry.url, "http://x").pathname)
            ? "sse"
            : "http"
          : (REMOTE_TYPES[type] ?? "http");
      if (type !== undefined && REMOTE_TYPES[type] === undefined) {
        throw new McpConfigError(`${where}: type "${type}" is not one of http, sse`);
      }
    } else {
      throw new McpConfigError(`${where} has neither "command" (stdio) nor "url" (HTTP)`);
    }
    const candidate: Record<string, unknown> = {
      name: name.replace(/[^A-Za-z0-9_-]+/g, "_").slice(0, 64),
      transport,
    };
    for (const [field, fieldValue] of Object.entries(entry)) {
      if (!FOREIGN_KEYS.includes(field)) candidate[field] = fieldValue;
    }
    const unsupported = JSON.stringify(candidate).match(/\$\{(input|workspaceFolder)[^}]*\}/);
    if (unsupported !== null) {
      throw new McpConfigError(
        `${where}: ${unsupported[0]} is not supported; use \${env:VAR} or \${file:/path}`,
      );
    }
    const parsed = McpServerConfigSchema.safeParse(candidate);
    if (!parsed.success) {
      throw new McpConfigError(`${where} is not a valid MCP server: ${issuesLine(parsed.error)}`);
    }
    configs.push(parsed.data);
  }
  return configs;
}

/** `${env:VAR}` and `${file:/path}` inside a string. */
const SECRET_REFERENCE = /\$\{(env|file):([^}]+)\}/g;

/** The environment variables a server's secrets come from. */
function secretVariables(config: McpServerConfig): string[] {
  const values: SecretValue[] =
    config.transport === "stdio"
      ? [...config.args, ...Object.values(config.env)]
      : Object.values(config.headers);
  const names = values.flatMap((v) =>
    typeof v === "string"
      ? [...v.matchAll(SECRET_REFERENCE)].flatMap((m) => (m[1] === "env" ? [m[2] ?? ""] : []))
      : "env" in v
        ? [v.env]
        : [],
  );
  if (config.transport !== "stdio" && config.auth?.env !== undefined) names.push(config.auth.env);
  return names;
}

/** Reads a secret value. Errors name the variable or file, never a value. */
export async function readSecret(
  value: SecretValue,
  env: Readonly<Record<string, string | undefined>>,
): Promise<string> {
  if (typeof value === "string") {
    let out = "";
    let last = 0;
    for (const match of value.matchAll(SECRET_REFERENCE)) {
      const reference = match[2] ?? "";
      out += value.slice(last, match.index);
      out += await readSecret(match[1] === "env" ? { env: reference } : { file: reference }, env);
      last = match.index + match[0].length;
    }
    return last === 0 ? value : out + value.slice(last);
  }
  if ("env" in value) {
    const found = env[value.env];
    if (found === undefined || found === "") {
      throw new McpConfigError(`environment variable ${value.env} is not set`);
    }
    return found;
  }
  try {
    return (await readFile(value.file, "utf8")).replace(/[\r\n]+$/, "");
  } catch (err) {
    throw new McpConfigError(
      `cannot read secret file ${value.file}: ${(err as NodeJS.ErrnoException).code ?? "error"}`,
    );
  }
}

/** The HTTP headers of a remote server, secrets read: its `headers` and its `auth` header. */
export async function remoteHeaders(
  config: Extract<McpServerConfig, { transport: "http" | "sse" }>,
  env: Readonly<Record<string, string | undefined>>,
): Promise<Record<string, string>> {
  const headers: Record<string, string> = {};
  for (const [name, value] of Object.entries(config.headers)) {
    headers[name] = await readSecret(value, env);
  }
  const auth = config.auth;
  if (auth !== undefined) {
    const secret = await readSecret(
      auth.env === undefined ? { file: auth.file ?? "" } : { env: auth.env },
      env,
    );
    if (auth.type === "bearer") headers[auth.header ?? "Authorization"] = `Bearer ${secret}`;
    else headers[auth.header ?? "X-API-Key"] = secret;
  }
  return headers;
}

/** The arguments of a stdio server, secrets read. */
export async function stdioArgs(
  config: Extract<McpServerConfig, { transport: "stdio" }>,
  env: Readonly<Record<string, string | undefined>>,
): Promise<string[]> {
  const out: string[] = [];
  for (const value of config.args) out.push(await readSecret(value, env));
  return out;
}

/** The extra environment of a stdio server, secrets read. */
export async function stdioEnv(
  config: Extract<McpServerConfig, { transport: "stdio" }>,
  env: Readonly<Record<string, string | undefined>>,
): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const [name, value] of Object.entries(config.env)) out[name] = await readSecret(value, env);
  return out;
}
