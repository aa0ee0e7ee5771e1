import { readFile, readdir } from "node:fs/promises";
import { extname, join, resolve } from "node:path";
import { parse as parseYaml } from "yaml";
import { z } from "zod";
import { RetryPolicySchema } from "@toolmesh/protocol";

/** Where server files are looked for when `TOOLMESH_MCP_DIR` is not set. */
export const DEFAULT_MCP_DIR = "tools/mcp";

const SERVER_FILE_EXTENSIONS = new Set([".yaml", ".yml"]);

/** Environment variable names as shells accept them. */
const envVarName = z
  .string()
  .regex(/^[A-Za-z_][A-Za-z0-9_]*$/, "must be an environment variable name");

/**
 * A value that may be a secret: a literal, the value of one of the bridge's environment
 * variables (`{ env: VAR }`), or the content of a file such as a mounted secret
 * (`{ file: /path }`, trailing newlines removed). Read at each (re)connect.
 */
export const SecretValueSchema = z.union([
  z.string(),
  z.strictObject({ env: envVarName }),
  z.strictObject({ file: z.string().min(1) }),
]);

/** A value that may be a secret; see {@link SecretValueSchema}. */
export type SecretValue = z.infer<typeof SecretValueSchema>;

/**
 * The credential sent as a header on every HTTP request (README.md#adding-an-mcp-server).
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
};

const StdioServerSchema = z.strictObject({
  ...common,
  transport: z.literal("stdio"),
  command: z.string().min(1),
  args: z.array(z.string()).default([]),
  /** Added to a minimal inherited environment (HOME, PATH, …), never the bridge's whole one. */
  env: z.record(envVarName, SecretValueSchema).default({}),
  cwd: z.string().min(1).optional(),
  /** A lazy server with no call for this long is stopped, in ms. */
  idle_timeout_ms: z.number().int().positive().optional(),
});

const remote = {
  url: z.url({ protocol: /^https?$/, error: "must be an http(s) URL" }),
  headers: z.record(z.string().min(1), SecretValueSchema).default({}),
  auth: AuthSchema.optional(),
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
  /** A missing folder is no servers rather than an error. Default: only for {@link DEFAULT_MCP_DIR}. */
  optional?: boolean;
  /** The environment `{ env: VAR }` secrets are read from; checked here so typos fail at start. */
  env: Readonly<Record<string, string | undefined>>;
}

/**
 * Reads every `*.yaml`/`*.yml` file of a folder (not recursive, in file-name order), one
 * MCP server each. A file that is not a valid server, two files with the same `name`, or a
 * secret variable that is not set fails the load with a message naming the file.
 */
export async function loadMcpServers(
  dir: string,
  options: LoadServersOptions,
): Promise<LoadedServer[]> {
  const root = resolve(dir);
  const optional = options.optional ?? dir === DEFAULT_MCP_DIR;
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
    const config = parseServerFile(await readFile(file, "utf8"), file);
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
  return loaded;
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
    throw new McpConfigError(
      `${file} is not a valid MCP server file: ${z.prettifyError(parsed.error)}`,
    );
  }
  return parsed.data;
}

/** The environment variables a server's secrets come from. */
function secretVariables(config: McpServerConfig): string[] {
  const values: SecretValue[] =
    config.transport === "stdio" ? Object.values(config.env) : Object.values(config.headers);
  const names = values.flatMap((v) => (typeof v === "object" && "env" in v ? [v.env] : []));
  if (config.transport !== "stdio" && config.auth?.env !== undefined) names.push(config.auth.env);
  return names;
}

/** Reads a secret value. Errors name the variable or file, never a value. */
export async function readSecret(
  value: SecretValue,
  env: Readonly<Record<string, string | undefined>>,
): Promise<string> {
  if (typeof value === "string") return value;
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

/** The extra environment of a stdio server, secrets read. */
export async function stdioEnv(
  config: Extract<McpServerConfig, { transport: "stdio" }>,
  env: Readonly<Record<string, string | undefined>>,
): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const [name, value] of Object.entries(config.env)) out[name] = await readSecret(value, env);
  return out;
}
