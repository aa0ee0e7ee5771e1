import { isIP } from "node:net";
import { z } from "zod";
import {
  assertValidPrefix,
  Defaults,
  issuesLine,
  parseDurationMs,
  tokenEndpointFromEnv,
} from "@toolmesh/protocol";
import type { TokenEndpoint } from "@toolmesh/protocol";

const LOG_LEVELS = ["fatal", "error", "warn", "info", "debug", "trace", "silent"] as const;

const positiveInt = z.coerce.number().int().positive();
const jsonObject = z.string().transform((text, ctx) => {
  try {
    const value: unknown = JSON.parse(text);
    if (typeof value === "object" && value !== null && !Array.isArray(value))
      return value as Record<string, unknown>;
  } catch {
    // reported below
  }
  ctx.addIssue({ code: "custom", message: "must be a JSON object" });
  return z.NEVER;
});
/** RFC 6901 JSON pointers naming a value inside the arguments (never the whole document). */
const jsonPointer = z
  .string()
  .regex(/^(\/([^~/]|~[01])*)+$/, "must be a JSON pointer such as /card/number");
/** How one tenant's arguments are recorded: `digest`, `full` or `{ "redact": [pointers] }`. */
const auditArgumentsRecording = z.union(
  [
    z.enum(["digest", "full"]).transform((kind) => ({ kind })),
    z
      .object({ redact: z.array(jsonPointer).min(1) })
      .strict()
      .transform(({ redact }) => ({ kind: "redacted" as const, pointers: redact })),
  ],
  {
    error: 'must be "digest", "full" or {"redact": [JSON pointers such as "/card/number"]}',
  },
);
/** Comma-separated http(s) URL prefixes. */
const urlPrefixes = z.string().transform((text, ctx) => {
  const prefixes = text
    .split(",")
    .map((p) => p.trim())
    .filter((p) => p !== "");
  if (prefixes.length === 0) {
    ctx.addIssue({ code: "custom", message: "must list at least one URL prefix" });
    return z.NEVER;
  }
  for (const prefix of prefixes) {
    if (!URL.canParse(prefix) || !/^https?:$/.test(new URL(prefix).protocol)) {
      ctx.addIssue({ code: "custom", message: `${prefix} is not an http(s) URL` });
      return z.NEVER;
    }
  }
  return prefixes;
});

/** `true`/`false`, or comma-separated IP addresses and CIDR ranges. */
const privateAllowance = z.string().transform((text, ctx): true | string[] => {
  const value = text.trim().toLowerCase();
  if (value === "true") return true;
  if (value === "false") return [];
  const entries = text
    .split(",")
    .map((e) => e.trim())
    .filter((e) => e !== "");
  for (const entry of entries) {
    const [address = "", bits] = entry.split("/");
    const family = isIP(address);
    const max = family === 4 ? 32 : 128;
    if (family === 0 || (bits !== undefined && !(/^\d+$/.test(bits) && Number(bits) <= max))) {
      ctx.addIssue({
        code: "custom",
        message: `${entry} is not an IP address or CIDR range (use true, false or a list like 127.0.0.1,10.0.0.0/8)`,
      });
      return z.NEVER;
    }
  }
  return entries;
});

const commaList = z.string().transform((text) =>
  text
    .split(",")
    .map((part) => part.trim())
    .filter((part) => part !== ""),
);
const httpUrl = z
  .string()
  .refine((text) => URL.canParse(text) && /^https?:$/.test(new URL(text).protocol), {
    message: "must be an http(s) URL",
  });

/** The MCP gateway's variables (docs/gateway.md), part of {@link EnvSchema}. */
export const GatewayEnvSchema = z.object({
  TOOLMESH_GATEWAY_PORT: z.coerce.number().int().min(0).max(65_535).default(Defaults.gatewayPort),
  TOOLMESH_GATEWAY_HOST: z.string().min(1).default("127.0.0.1"),
  TOOLMESH_GATEWAY_KEYS_FILE: z.string().min(1).optional(),
  TOOLMESH_GATEWAY_ANONYMOUS_TENANT: z.string().min(1).max(256).optional(),
  TOOLMESH_GATEWAY_JWKS_URL: httpUrl.optional(),
  TOOLMESH_GATEWAY_JWT_ISSUER: z.string().min(1).optional(),
  TOOLMESH_GATEWAY_JWT_AUDIENCE: z.string().min(1).optional(),
  TOOLMESH_GATEWAY_TENANT_CLAIM: z.string().min(1).default("tenant"),
  TOOLMESH_GATEWAY_AGENTS_CLAIM: z.string().min(1).default("agents"),
  TOOLMESH_GATEWAY_REQUIRED_SCOPES: commaList.optional(),
  TOOLMESH_GATEWAY_AUTHORIZATION_SERVERS: commaList.optional(),
  TOOLMESH_GATEWAY_RESOURCE_URL: httpUrl.optional(),
  TOOLMESH_GATEWAY_MAX_BODY_BYTES: positiveInt.default(Defaults.gatewayMaxBodyBytes),
  TOOLMESH_GATEWAY_ALLOWED_ORIGINS: commaList.optional(),
  TOOLMESH_GATEWAY_MAX_CONCURRENT: positiveInt.default(Defaults.gatewayMaxConcurrent),
  TOOLMESH_GATEWAY_RATE_PER_S: z.coerce.number().min(0).default(Defaults.gatewayRatePerS),
  TOOLMESH_GATEWAY_RATE_BURST: positiveInt.default(Defaults.gatewayRateBurst),
  TOOLMESH_GATEWAY_LIMITS: z.enum(["replica", "mesh"]).default("replica"),
  TOOLMESH_GATEWAY_REQUEST_STATE_KEY: z
    .string()
    .min(32, "must be at least 32 characters (every replica needs the same key)")
    .optional(),
  TOOLMESH_GATEWAY_REQUEST_STATE_TTL_MS: positiveInt.min(1_000).default(600_000),
  TOOLMESH_GATEWAY_CONSENT_URL: z
    .string()
    .refine((template) => {
      const text = template.replaceAll("{audience}", "a").replaceAll("{scope}", "s");
      return URL.canParse(text) && /^https?:$/.test(new URL(text).protocol);
    }, "must be an http(s) URL; {audience} and {scope} in it are filled in")
    .optional(),
});

/**
 * Every environment variable toolmesh reads, with its default. Parsed once, in the
 * entrypoint; nothing else reads the environment.
 */
export const EnvSchema = z.object({
  ...GatewayEnvSchema.shape,
  NATS_URL: z.string().min(1).default("nats://127.0.0.1:4222"),
  NATS_CREDS: z.string().min(1).optional(),
  NATS_NKEY: z.string().min(1).optional(),
  NATS_USER: z.string().min(1).optional(),
  NATS_PASSWORD: z.string().optional(),
  NATS_TOKEN: z.string().min(1).optional(),
  TOOLMESH_PREFIX: z
    .string()
    .default(Defaults.prefix)
    .refine(
      (p) => {
        try {
          assertValidPrefix(p);
          return true;
        } catch {
          return false;
        }
      },
      { message: "must be dot-separated parts of [a-z0-9-]" },
    ),
  TOOLMESH_TENANT: z.string().min(1).max(256).default(Defaults.tenant),
  TOOLMESH_LOG_LEVEL: z.enum(LOG_LEVELS).default("info"),
  TOOLMESH_TOOLS_DIR: z.string().min(1).default("tools/builtin"),
  TOOLMESH_PRESETS_FILE: z.string().min(1).optional(),
  TOOLMESH_SECRET_KEYS: z.string().min(1).optional(),
  TOOLMESH_TOKEN_URL: z.url().optional(),
  TOOLMESH_TOKEN_CLIENT_ID: z.string().min(1).optional(),
  TOOLMESH_TOKEN_CLIENT_SECRET: z.string().min(1).optional(),
  TOOLMESH_TOOLKIT_CONTEXT: jsonObject.optional(),
  TOOLMESH_EXECUTOR_OWNER: z.string().min(1).default("executor"),
  TOOLMESH_OWNER: z
    .string()
    .regex(/^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$/, {
      message: 'must be 1 to 64 letters, digits, "-" or "_", starting with a letter or digit',
    })
    .optional(),
  TOOLMESH_CONCURRENCY: positiveInt.default(Defaults.concurrency),
  TOOLMESH_DEFAULT_TIMEOUT_MS: positiveInt.default(Defaults.callTimeoutMs),
  TOOLMESH_MAX_MESSAGE_BYTES: positiveInt.default(Defaults.maxMessageBytes),
  TOOLMESH_MAX_RESULT_BYTES: positiveInt.default(Defaults.maxResultBytes),
  TOOLMESH_SHUTDOWN_GRACE_MS: positiveInt.default(Defaults.shutdownGraceMs),
  TOOLMESH_SHUTDOWN_FORCE_MS: positiveInt.default(Defaults.shutdownForceMs),
  TOOLMESH_ACK_WAIT_MS: positiveInt.default(Defaults.ackWaitMs),
  TOOLMESH_SESSION_MAX_IN_FLIGHT: positiveInt.default(Defaults.sessionMaxInFlight),
  TOOLMESH_QUOTA_RECONCILE_MS: positiveInt.default(5_000),
  // "auto": each tool's window is its announced capacity (ADR 0055).
  TOOLMESH_FAIR_SHARE_WINDOW: z
    .union([z.literal("auto"), z.coerce.number().int().min(0)])
    .default("auto"),
  TOOLMESH_FAIR_SHARE_IDLE_MS: z.coerce.number().int().min(0).default(1_000),
  // Default: TOOLMESH_MAX_RESULT_BYTES.
  TOOLMESH_TENANT_MAX_BYTES_IN_FLIGHT: z.coerce.number().int().min(0).optional(),
  TOOLMESH_CALL_RETENTION_MS: positiveInt.default(Defaults.callRetentionMs),
  TOOLMESH_DUPLICATE_WINDOW_MS: positiveInt.default(Defaults.duplicateWindowMs),
  TOOLMESH_MAX_QUEUED_CALLS: positiveInt.default(Defaults.maxQueuedCalls),
  TOOLMESH_MAX_QUEUED_CALLS_PER_SESSION: positiveInt.default(Defaults.maxQueuedCallsPerSession),
  TOOLMESH_MAX_QUEUED_CALLS_PER_TENANT: positiveInt.default(Defaults.maxQueuedCallsPerTenant),
  TOOLMESH_STORE_BYTES: positiveInt.default(Defaults.storeBytes),
  TOOLMESH_TENANT_STORE_BYTES: positiveInt.default(Defaults.tenantStoreBytes),
  // `on` is `required`: a mesh that records calls records every call unless told otherwise.
  TOOLMESH_AUDIT: z
    .enum(["off", "on", "required", "best-effort"])
    .default("off")
    .transform((v) => (v === "on" ? "required" : v)),
  TOOLMESH_AUDIT_ARGUMENTS: jsonObject
    .pipe(z.record(z.string().min(1), auditArgumentsRecording))
    .default({}),
  TOOLMESH_AUDIT_RETENTION: z
    .string()
    .transform((value, ctx) => {
      const ms = parseDurationMs(value);
      if (ms === undefined || ms <= 0) {
        ctx.addIssue({ code: "custom", message: "must be a duration such as 30d or 2160h" });
        return z.NEVER;
      }
      return ms;
    })
    .default(Defaults.auditRetentionMs),
  TOOLMESH_OWNER_STORE_BYTES: positiveInt.default(Defaults.ownerStoreBytes),
  TOOLMESH_TENANT_MAX_STORED_BYTES: z.coerce
    .number()
    .int()
    .min(0)
    .default(Defaults.tenantMaxStoredBytes),
  TOOLMESH_MAX_DEAD_LETTERS: positiveInt.default(Defaults.maxDeadLetters),
  TOOLMESH_HEALTH_PORT: z.coerce.number().int().min(0).max(65_535).optional(),
  TOOLMESH_CONFIG_DIR: z.string().min(1).default("configs"),
  TOOLMESH_SESSION_STATE_TTL_MS: positiveInt.default(Defaults.sessionStateTtlMs),
  TOOLMESH_NATIVE_TOOLS_DIR: z.string().min(1).default(Defaults.nativeToolsDir),
  TOOLMESH_NATIVE_ALLOWED_URLS: urlPrefixes.optional(),
  TOOLMESH_MCP_DIR: z.string().min(1).default(Defaults.mcpDir),
  NATS_CERT: z.string().min(1).optional(),
  NATS_KEY: z.string().min(1).optional(),
  NATS_CA: z.string().min(1).optional(),
  TOOLMESH_ALLOW_PRIVATE_ADDRESSES: privateAllowance.default([]),
  TOOLMESH_TRUST_CONFIGURED_HOSTS: z.enum(["true", "false"]).default("true"),
  TOOLMESH_STREAM_REPLICAS: z.coerce.number().int().min(1).max(5).default(1),
  TOOLMESH_STREAM_COMPRESSION: z.enum(["s2", "none"]).default(Defaults.streamCompression),
  TOOLMESH_REPUBLISH_HEADS: z.enum(["on", "off"]).default("off"),
  TOOLMESH_METRICS_PORT: z.coerce.number().int().min(0).max(65_535).optional(),
  TOOLMESH_TRACE_PAYLOADS: z.enum(["true", "false"]).default("false"),
  TOOLMESH_STARTUP_TIMEOUT_MS: z.coerce.number().int().min(0).default(Defaults.startupTimeoutMs),
  TOOLMESH_LIVENESS_DISCONNECTED_MS: positiveInt.default(Defaults.livenessDisconnectedMs),
});

/** The parsed configuration of a toolmesh process. Durations in ms. */
export interface RuntimeConfig {
  nats: {
    servers: string;
    creds?: string;
    nkey?: string;
    user?: string;
    password?: string;
    token?: string;
    /** Path of a PEM client certificate (`NATS_CERT`). */
    tlsCert?: string;
    /** Path of its PEM key (`NATS_KEY`). */
    tlsKey?: string;
    /** Path of a PEM CA bundle for the server's certificate (`NATS_CA`). */
    tlsCa?: string;
  };
  prefix: string;
  tenant: string;
  logLevel: (typeof LOG_LEVELS)[number];
  toolsDir: string;
  presetsFile?: string;
  /**
   * The keys sealing users' secrets (`TOOLMESH_SECRET_KEYS`): `kid:base64key,…`, the first one
   * current. Parsed by the executor and the CLI.
   */
  secretKeys?: string;
  /**
   * The authorization server's token endpoint and the mesh's client there
   * (`TOOLMESH_TOKEN_URL`, `TOOLMESH_TOKEN_CLIENT_ID`, `TOOLMESH_TOKEN_CLIENT_SECRET`), for tools
   * whose credentials are `token-exchange`: the gateway exchanges callers' tokens, executors
   * refresh the grants.
   */
  tokenEndpoint?: TokenEndpoint;
  toolkitContext: Record<string, unknown>;
  executorOwner: string;
  /**
   * The tool owner whose NATS account an executor or MCP bridge lives in (ADR 0031). Set, the
   * process holds no JetStream rights of the mesh: it registers, reads records and ends calls
   * through the mesh's owner services and pulls work through its account's imports. Unset, it
   * lives in the mesh account.
   */
  owner?: string;
  concurrency: number;
  defaultTimeoutMs: number;
  maxMessageBytes: number;
  /** Largest tool result (the final message's JSON), in bytes; larger ends the call. */
  maxResultBytes: number;
  shutdownGraceMs: number;
  /** How long shutdown waits past the grace time before it abandons handlers, in ms. */
  shutdownForceMs: number;
  /** How long a delivered call stays owned without a heartbeat, in ms. */
  ackWaitMs: number;
  /** Calls of one session in flight through one resolver. */
  sessionMaxInFlight: number;
  /** How often quota counts of calls that ended unseen are reconciled, in ms. */
  quotaReconcileMs: number;
  /**
   * Calls of one tool outstanding in the work stream before others are held for a fair turn, for
   * every tool; 0 = off; `"auto"` (the default) = each tool's capacity as its executors announce it.
   */
  fairShareWindow: number | "auto";
  /** How long after its last call of a tool a tenant keeps slots of the fair-share window free, in ms; 0 = none. */
  fairShareIdleMs: number;
  /**
   * Bytes one tenant's calls may have in flight through one resolver before its further calls
   * wait; 0 = off. Default `maxResultBytes` (512 KiB).
   */
  tenantMaxBytesInFlight: number;

  /** How long call records (the idempotency horizon) are kept, in ms. */
  callRetentionMs: number;
  /** Window in which a repeated message id is dropped by the streams, in ms. */
  duplicateWindowMs: number;
  /** Most calls waiting in the calls or work stream. */
  maxQueuedCalls: number;
  /** Most calls of one session waiting in the calls stream; the server refuses more. */
  maxQueuedCallsPerSession: number;
  /** Most calls of one tenant waiting in its own calls stream (ADR 0048); the server refuses more. */
  maxQueuedCallsPerTenant: number;
  /** Bytes the mesh's own streams may hold together, shared out among them (ADR 0050). */
  storeBytes: number;
  /** Bytes each tenant's own calls stream may hold. */
  tenantStoreBytes: number;
  /** Bytes each tool owner's work stream may hold. */
  ownerStoreBytes: number;
  /**
   * Whether calls are recorded in their tenant's audit stream (ADR 0060): `off`, `required`
   * (a call whose admission cannot be recorded is refused `unavailable`) or `best-effort`.
   */
  audit: "off" | "required" | "best-effort";
  /** How long each tenant's audit events are kept, in ms. */
  auditRetentionMs: number;
  /**
   * How each tenant's call arguments are recorded, by tenant id (`TOOLMESH_AUDIT_ARGUMENTS`);
   * a tenant not named: their digest only.
   */
  auditArguments: Record<
    string,
    { kind: "digest" } | { kind: "full" } | { kind: "redacted"; pointers: string[] }
  >;
  /** Bytes of final messages each tenant's calls may have stored within the retention; 0: none. */
  tenantMaxStoredBytes: number;
  /** Most dead letters kept; past it the oldest go (ADR 0051). */
  maxDeadLetters: number;
  /** Port of the `/healthz` and `/readyz` endpoints; none when unset. */
  healthPort?: number;
  /** The executor's folder of native HTTP tools (`*.yaml`); a missing default folder is none. */
  nativeToolsDir: string;
  /** URL prefixes native tools may call; any URL when unset. */
  nativeAllowedUrls?: string[];
  /** The mcp-bridge's folder of MCP server files (`*.yaml`); a missing default folder is none. */
  mcpDir: string;
  /** Folder of `tool_sets/*.yaml` and `agents/*.yaml`; a missing folder is none. */
  configDir: string;
  /** How long a session's state (schemas sent, groups, agent) lives after its last change, in ms. */
  sessionStateTtlMs: number;
  /**
   * Private addresses (loopback, private networks, link-local, …) that native tools and HTTP
   * MCP servers may reach: `true` any, else these addresses and CIDR ranges. Default none.
   */
  allowPrivateAddresses: true | readonly string[];
  /** Whether the exact host of a configured URL skips the private-address check. Default true. */
  trustConfiguredHosts: boolean;
  /** Replicas of every stream and KV bucket (1 on one server; 3 or 5 on a cluster). */
  streamReplicas: number;
  /** Compression of every stream and KV bucket on nats-server 2.10+ (ADR 0044). */
  streamCompression: "s2" | "none";
  /** Whether the work and sessions streams republish headers for the keepers (ADR 0066). */
  republishHeads: boolean;
  /** How long a service keeps trying to reach NATS at start-up before it exits, in ms. */
  startupTimeoutMs: number;
  /** How long a running service may stay disconnected from NATS and still be alive, in ms. */
  livenessDisconnectedMs: number;
  /** The raw environment, for libraries that follow standard variables (OTEL_*). */
  env: Readonly<Record<string, string | undefined>>;
  /** Port of the Prometheus scrape endpoint `GET /metrics`; none when unset. */
  metricsPort?: number;
  /** Whether spans record tool arguments and results (redacted). */
  tracePayloads: boolean;
}

/** A configuration value that cannot be used; the message names the variable. */
export class ConfigError extends Error {
  override readonly name = "ConfigError";
}

/** `TOOLMESH_TOKEN_*`: all three or none. */
function tokenEndpointOf(e: z.infer<typeof EnvSchema>): { tokenEndpoint?: TokenEndpoint } {
  let endpoint: TokenEndpoint | undefined;
  try {
    endpoint = tokenEndpointFromEnv({
      TOOLMESH_TOKEN_URL: e.TOOLMESH_TOKEN_URL,
      TOOLMESH_TOKEN_CLIENT_ID: e.TOOLMESH_TOKEN_CLIENT_ID,
      TOOLMESH_TOKEN_CLIENT_SECRET: e.TOOLMESH_TOKEN_CLIENT_SECRET,
    });
  } catch (err) {
    throw new ConfigError(`invalid configuration: ${(err as Error).message}`);
  }
  return endpoint === undefined ? {} : { tokenEndpoint: endpoint };
}

/**
 * The environment with flag overrides applied, parsed and checked as a whole; throws a
 * {@link ConfigError} naming every variable that cannot be used.
 */
function parseEnv(
  env: Readonly<Record<string, string | undefined>>,
  overrides: Partial<Record<keyof z.input<typeof EnvSchema>, string | undefined>>,
): z.infer<typeof EnvSchema> {
  const merged: Record<string, string | undefined> = { ...env };
  for (const [k, v] of Object.entries(overrides)) if (v !== undefined) merged[k] = v;
  // Empty variables count as unset, as shells and compose files often leave them so.
  for (const [k, v] of Object.entries(merged)) if (v === "") delete merged[k];
  const parsed = EnvSchema.safeParse(merged);
  if (!parsed.success) {
    throw new ConfigError(`invalid configuration: ${issuesLine(parsed.error)}`);
  }
  const e = parsed.data;
  if ((e.NATS_CERT === undefined) !== (e.NATS_KEY === undefined)) {
    throw new ConfigError(
      "invalid configuration: NATS_CERT and NATS_KEY (--tlscert, --tlskey) are set together: a client certificate and its key",
    );
  }
  return e;
}

/** The NATS connection settings (`NATS_*`), only those that are set. */
function natsOf(e: z.infer<typeof EnvSchema>): RuntimeConfig["nats"] {
  return {
    servers: e.NATS_URL,
    ...(e.NATS_CREDS === undefined ? {} : { creds: e.NATS_CREDS }),
    ...(e.NATS_NKEY === undefined ? {} : { nkey: e.NATS_NKEY }),
    ...(e.NATS_USER === undefined ? {} : { user: e.NATS_USER }),
    ...(e.NATS_PASSWORD === undefined ? {} : { password: e.NATS_PASSWORD }),
    ...(e.NATS_TOKEN === undefined ? {} : { token: e.NATS_TOKEN }),
    ...(e.NATS_CERT === undefined ? {} : { tlsCert: e.NATS_CERT }),
    ...(e.NATS_KEY === undefined ? {} : { tlsKey: e.NATS_KEY }),
    ...(e.NATS_CA === undefined ? {} : { tlsCa: e.NATS_CA }),
  };
}

/** Parses the environment (and flag overrides, which win) into a {@link RuntimeConfig}. */
export function loadConfig(
  env: Readonly<Record<string, string | undefined>>,
  overrides: Partial<Record<keyof z.input<typeof EnvSchema>, string | undefined>> = {},
): RuntimeConfig {
  const e = parseEnv(env, overrides);
  return {
    nats: natsOf(e),
    prefix: e.TOOLMESH_PREFIX,
    tenant: e.TOOLMESH_TENANT,
    logLevel: e.TOOLMESH_LOG_LEVEL,
    toolsDir: e.TOOLMESH_TOOLS_DIR,
    ...(e.TOOLMESH_PRESETS_FILE === undefined ? {} : { presetsFile: e.TOOLMESH_PRESETS_FILE }),
    ...(e.TOOLMESH_SECRET_KEYS === undefined ? {} : { secretKeys: e.TOOLMESH_SECRET_KEYS }),
    ...tokenEndpointOf(e),
    toolkitContext: e.TOOLMESH_TOOLKIT_CONTEXT ?? {},
    executorOwner: e.TOOLMESH_EXECUTOR_OWNER,
    ...(e.TOOLMESH_OWNER === undefined ? {} : { owner: e.TOOLMESH_OWNER }),
    concurrency: e.TOOLMESH_CONCURRENCY,
    defaultTimeoutMs: e.TOOLMESH_DEFAULT_TIMEOUT_MS,
    maxMessageBytes: e.TOOLMESH_MAX_MESSAGE_BYTES,
    maxResultBytes: e.TOOLMESH_MAX_RESULT_BYTES,
    shutdownGraceMs: e.TOOLMESH_SHUTDOWN_GRACE_MS,
    shutdownForceMs: e.TOOLMESH_SHUTDOWN_FORCE_MS,
    ackWaitMs: e.TOOLMESH_ACK_WAIT_MS,
    sessionMaxInFlight: e.TOOLMESH_SESSION_MAX_IN_FLIGHT,
    quotaReconcileMs: e.TOOLMESH_QUOTA_RECONCILE_MS,
    fairShareWindow: e.TOOLMESH_FAIR_SHARE_WINDOW,
    fairShareIdleMs: e.TOOLMESH_FAIR_SHARE_IDLE_MS,
    tenantMaxBytesInFlight: e.TOOLMESH_TENANT_MAX_BYTES_IN_FLIGHT ?? e.TOOLMESH_MAX_RESULT_BYTES,
    callRetentionMs: e.TOOLMESH_CALL_RETENTION_MS,
    duplicateWindowMs: e.TOOLMESH_DUPLICATE_WINDOW_MS,
    maxQueuedCalls: e.TOOLMESH_MAX_QUEUED_CALLS,
    maxQueuedCallsPerSession: e.TOOLMESH_MAX_QUEUED_CALLS_PER_SESSION,
    maxQueuedCallsPerTenant: e.TOOLMESH_MAX_QUEUED_CALLS_PER_TENANT,
    storeBytes: e.TOOLMESH_STORE_BYTES,
    tenantStoreBytes: e.TOOLMESH_TENANT_STORE_BYTES,
    ownerStoreBytes: e.TOOLMESH_OWNER_STORE_BYTES,
    audit: e.TOOLMESH_AUDIT,
    auditRetentionMs: e.TOOLMESH_AUDIT_RETENTION,
    auditArguments: e.TOOLMESH_AUDIT_ARGUMENTS,
    tenantMaxStoredBytes: e.TOOLMESH_TENANT_MAX_STORED_BYTES,
    maxDeadLetters: e.TOOLMESH_MAX_DEAD_LETTERS,
    ...(e.TOOLMESH_HEALTH_PORT === undefined ? {} : { healthPort: e.TOOLMESH_HEALTH_PORT }),
    nativeToolsDir: e.TOOLMESH_NATIVE_TOOLS_DIR,
    ...(e.TOOLMESH_NATIVE_ALLOWED_URLS === undefined
      ? {}
      : { nativeAllowedUrls: e.TOOLMESH_NATIVE_ALLOWED_URLS }),
    mcpDir: e.TOOLMESH_MCP_DIR,
    configDir: e.TOOLMESH_CONFIG_DIR,
    sessionStateTtlMs: e.TOOLMESH_SESSION_STATE_TTL_MS,
    allowPrivateAddresses: e.TOOLMESH_ALLOW_PRIVATE_ADDRESSES,
    trustConfiguredHosts: e.TOOLMESH_TRUST_CONFIGURED_HOSTS === "true",
    streamReplicas: e.TOOLMESH_STREAM_REPLICAS,
    streamCompression: e.TOOLMESH_STREAM_COMPRESSION,
    republishHeads: e.TOOLMESH_REPUBLISH_HEADS === "on",
    startupTimeoutMs: e.TOOLMESH_STARTUP_TIMEOUT_MS,
    livenessDisconnectedMs: e.TOOLMESH_LIVENESS_DISCONNECTED_MS,
    env,
    ...(e.TOOLMESH_METRICS_PORT === undefined ? {} : { metricsPort: e.TOOLMESH_METRICS_PORT }),
    tracePayloads: e.TOOLMESH_TRACE_PAYLOADS === "true",
  };
}
