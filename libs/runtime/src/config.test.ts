import { describe, expect, it } from "vitest";
import { Defaults } from "@toolmesh/protocol";
import { ConfigError, loadConfig } from "./config.js";
import type { RuntimeConfig } from "./config.js";

/** The ConfigError `env` fails with. */
function refusal(
  env: Record<string, string | undefined>,
  overrides: Parameters<typeof loadConfig>[1] = {},
): ConfigError {
  try {
    loadConfig(env, overrides);
  } catch (err) {
    expect(err).toBeInstanceOf(ConfigError);
    return err as ConfigError;
  }
  throw new Error(`expected ${JSON.stringify(env)} to be refused`);
}

/** Whole numbers: each variable, the field it sets, its default and the smallest value allowed. */
const NUMBERS: [string, keyof RuntimeConfig, number, number][] = [
  ["TOOLMESH_DEFAULT_TIMEOUT_MS", "defaultTimeoutMs", Defaults.callTimeoutMs, 1],
  ["TOOLMESH_MAX_MESSAGE_BYTES", "maxMessageBytes", Defaults.maxMessageBytes, 1],
  ["TOOLMESH_SHUTDOWN_GRACE_MS", "shutdownGraceMs", Defaults.shutdownGraceMs, 1],
  ["TOOLMESH_ACK_WAIT_MS", "ackWaitMs", Defaults.ackWaitMs, 1],
  ["TOOLMESH_CALL_RETENTION_MS", "callRetentionMs", Defaults.callRetentionMs, 1],
  ["TOOLMESH_DUPLICATE_WINDOW_MS", "duplicateWindowMs", Defaults.duplicateWindowMs, 1],
  ["TOOLMESH_SESSION_STATE_TTL_MS", "sessionStateTtlMs", Defaults.sessionStateTtlMs, 1],
  ["TOOLMESH_STARTUP_TIMEOUT_MS", "startupTimeoutMs", Defaults.startupTimeoutMs, 0],
  ["TOOLMESH_MAX_QUEUED_CALLS", "maxQueuedCalls", Defaults.maxQueuedCalls, 1],
  [
    "TOOLMESH_MAX_QUEUED_CALLS_PER_SESSION",
    "maxQueuedCallsPerSession",
    Defaults.maxQueuedCallsPerSession,
    1,
  ],
  [
    "TOOLMESH_MAX_QUEUED_CALLS_PER_TENANT",
    "maxQueuedCallsPerTenant",
    Defaults.maxQueuedCallsPerTenant,
    1,
  ],
  ["TOOLMESH_SESSION_MAX_IN_FLIGHT", "sessionMaxInFlight", Defaults.sessionMaxInFlight, 1],
  ["TOOLMESH_CONCURRENCY", "concurrency", Defaults.concurrency, 1],
];

describe("loadConfig", () => {
  it("takes every default from Defaults when nothing is set", () => {
    const config = loadConfig({});
    expect(config).toMatchObject({
      nats: { servers: "nats://127.0.0.1:4222" },
      prefix: Defaults.prefix,
      tenant: Defaults.tenant,
      logLevel: "info",
      toolsDir: "tools/builtin",
      nativeToolsDir: "tools/native",
      mcpDir: "tools/mcp",
      configDir: "configs",
      toolkitContext: {},
      executorOwner: "executor",
      allowPrivateAddresses: [],
      tracePayloads: false,
    });
    for (const [, field, fallback] of NUMBERS) expect(config[field], field).toBe(fallback);
    for (const optional of [
      "presetsFile",
      "healthPort",
      "metricsPort",
      "nativeAllowedUrls",
    ] as const) {
      expect(config, optional).not.toHaveProperty(optional);
    }
    expect(config.nats).toEqual({ servers: "nats://127.0.0.1:4222" });
  });

  it.each(NUMBERS)("parses %s into %s", (variable, field, _fallback, min) => {
    expect(loadConfig({ [variable]: "1234" })[field]).toBe(1234);
    expect(loadConfig({ [variable]: String(min) })[field]).toBe(min);
  });

  it.each(NUMBERS)("refuses a bad %s, naming it", (variable, _field, _fallback, min) => {
    for (const bad of ["soon", "1.5", String(min - 1), "10s"]) {
      const error = refusal({ [variable]: bad });
      expect(error.message, `${variable}=${bad}`).toMatch(
        new RegExp(`^invalid configuration: ${variable}: `),
      );
    }
  });

  it("compresses streams with s2 unless told none, and refuses anything else", () => {
    expect(loadConfig({}).streamCompression).toBe("s2");
    expect(loadConfig({ TOOLMESH_STREAM_COMPRESSION: "none" }).streamCompression).toBe("none");
    expect(refusal({ TOOLMESH_STREAM_COMPRESSION: "gzip" }).message).toContain(
      "TOOLMESH_STREAM_COMPRESSION",
    );
  });

  it("takes 1 to 5 stream replicas (default 1) and ports 0–65535", () => {
    expect(loadConfig({}).streamReplicas).toBe(1);
    expect(loadConfig({ TOOLMESH_STREAM_REPLICAS: "3" }).streamReplicas).toBe(3);
    expect(refusal({ TOOLMESH_STREAM_REPLICAS: "0" }).message).toContain(
      "TOOLMESH_STREAM_REPLICAS",
    );
    expect(refusal({ TOOLMESH_STREAM_REPLICAS: "6" }).message).toContain(
      "TOOLMESH_STREAM_REPLICAS",
    );
    expect(refusal({ TOOLMESH_HEALTH_PORT: "65536" }).message).toContain("TOOLMESH_HEALTH_PORT");
    expect(refusal({ TOOLMESH_METRICS_PORT: "-1" }).message).toContain("TOOLMESH_METRICS_PORT");
    expect(loadConfig({ TOOLMESH_HEALTH_PORT: "0", TOOLMESH_METRICS_PORT: "9464" })).toMatchObject({
      healthPort: 0,
      metricsPort: 9464,
    });
  });

  it("names every bad variable at once", () => {
    const { message } = refusal({ TOOLMESH_ACK_WAIT_MS: "x", TOOLMESH_LOG_LEVEL: "loud" });
    expect(message).toContain("TOOLMESH_ACK_WAIT_MS: ");
    expect(message).toContain("TOOLMESH_LOG_LEVEL: ");
  });

  it("takes paths as given", () => {
    const config = loadConfig({
      TOOLMESH_TOOLS_DIR: "/srv/tools",
      TOOLMESH_NATIVE_TOOLS_DIR: "native",
      TOOLMESH_MCP_DIR: "./mcp servers",
      TOOLMESH_CONFIG_DIR: "/etc/toolmesh",
      TOOLMESH_PRESETS_FILE: "presets.yaml",
      NATS_CREDS: "/run/secrets/user.creds",
      NATS_CERT: "cert.pem",
      NATS_KEY: "key.pem",
      NATS_CA: "ca.pem",
    });
    expect(config).toMatchObject({
      toolsDir: "/srv/tools",
      nativeToolsDir: "native",
      mcpDir: "./mcp servers",
      configDir: "/etc/toolmesh",
      presetsFile: "presets.yaml",
      nats: {
        creds: "/run/secrets/user.creds",
        tlsCert: "cert.pem",
        tlsKey: "key.pem",
        tlsCa: "ca.pem",
      },
    });
  });

  it("refuses a client certificate without its key, and a key without its certificate", () => {
    expect(refusal({ NATS_CERT: "cert.pem" }).message).toMatch(/NATS_CERT and NATS_KEY/);
    expect(refusal({ NATS_KEY: "key.pem" }).message).toMatch(/NATS_CERT and NATS_KEY/);
  });

  it("refuses values outside each variable's set, naming the variable", () => {
    const cases: Record<string, string> = {
      TOOLMESH_LOG_LEVEL: "verbose",
      TOOLMESH_TRACE_PAYLOADS: "yes",
      TOOLMESH_PREFIX: "Tool_Mesh",
      TOOLMESH_TOOLKIT_CONTEXT: "[1, 2]",
      TOOLMESH_NATIVE_ALLOWED_URLS: "ftp://files.example.com/",
      TOOLMESH_ALLOW_PRIVATE_ADDRESSES: "10.0.0.0/33",
      TOOLMESH_TENANT: "t".repeat(257),
    };
    for (const [variable, value] of Object.entries(cases)) {
      expect(refusal({ [variable]: value }).message, variable).toContain(`${variable}: `);
    }
  });

  it("reads each tenant's choice of argument recording; digest for the others", () => {
    expect(loadConfig({}).auditArguments).toEqual({});
    const config = loadConfig({
      TOOLMESH_AUDIT_ARGUMENTS: JSON.stringify({
        acme: "full",
        beta: { redact: ["/card/number", "/a~1b"] },
        gamma: "digest",
      }),
    });
    expect(config.auditArguments).toEqual({
      acme: { kind: "full" },
      beta: { kind: "redacted", pointers: ["/card/number", "/a~1b"] },
      gamma: { kind: "digest" },
    });
    const bad = ['{"acme":"some"}', '{"acme":{"redact":["card"]}}', '{"acme":{"drop":["/a"]}}'];
    for (const value of bad)
      expect(refusal({ TOOLMESH_AUDIT_ARGUMENTS: value }).message).toContain(
        'TOOLMESH_AUDIT_ARGUMENTS.acme: must be "digest", "full" or {"redact"',
      );
    expect(refusal({ TOOLMESH_AUDIT_ARGUMENTS: "[]" }).message).toContain(
      "TOOLMESH_AUDIT_ARGUMENTS: must be a JSON object",
    );
  });

  it("reads the structured variables", () => {
    const config = loadConfig({
      TOOLMESH_LOG_LEVEL: "debug",
      TOOLMESH_TRACE_PAYLOADS: "true",
      TOOLMESH_PREFIX: "acme.tools",
      TOOLMESH_TOOLKIT_CONTEXT: '{"region":"eu"}',
      TOOLMESH_NATIVE_ALLOWED_URLS: "https://api.example.com/, http://10.0.0.1:8080/v1",
      TOOLMESH_ALLOW_PRIVATE_ADDRESSES: "127.0.0.1, 10.0.0.0/8",
    });
    expect(config).toMatchObject({
      logLevel: "debug",
      tracePayloads: true,
      prefix: "acme.tools",
      toolkitContext: { region: "eu" },
      nativeAllowedUrls: ["https://api.example.com/", "http://10.0.0.1:8080/v1"],
      allowPrivateAddresses: ["127.0.0.1", "10.0.0.0/8"],
    });
    expect(loadConfig({ TOOLMESH_ALLOW_PRIVATE_ADDRESSES: "TRUE" }).allowPrivateAddresses).toBe(
      true,
    );
    expect(loadConfig({ TOOLMESH_ALLOW_PRIVATE_ADDRESSES: "false" }).allowPrivateAddresses).toEqual(
      [],
    );
  });

  it("treats empty variables as unset, lets flag overrides win, ignores unknown variables", () => {
    const env = { TOOLMESH_ACK_WAIT_MS: "", NATS_URL: "nats://env:4222", TOOLMESH_NOPE: "x" };
    const config = loadConfig(env, { NATS_URL: "nats://flag:4222", TOOLMESH_TENANT: undefined });
    expect(config.ackWaitMs).toBe(Defaults.ackWaitMs);
    expect(config.nats.servers).toBe("nats://flag:4222");
    expect(config.tenant).toBe(Defaults.tenant);
    // The raw environment stays available for libraries that read standard variables.
    expect(config.env).toBe(env);
  });
});

describe("the token endpoint of token-exchange tools", () => {
  it("takes TOOLMESH_TOKEN_URL, _CLIENT_ID and _CLIENT_SECRET together", () => {
    const config = loadConfig({
      TOOLMESH_TOKEN_URL: "https://auth.example/token",
      TOOLMESH_TOKEN_CLIENT_ID: "toolmesh",
      TOOLMESH_TOKEN_CLIENT_SECRET: "s3cret",
    });
    expect(config.tokenEndpoint).toEqual({
      url: "https://auth.example/token",
      clientId: "toolmesh",
      clientSecret: "s3cret",
    });
    expect(loadConfig({}).tokenEndpoint).toBeUndefined();
  });

  it("refuses one without the others, and a URL that is not one, saying what to set", () => {
    expect(refusal({ TOOLMESH_TOKEN_URL: "https://auth.example/token" }).message).toMatch(
      /TOOLMESH_TOKEN_URL, TOOLMESH_TOKEN_CLIENT_ID and TOOLMESH_TOKEN_CLIENT_SECRET together/,
    );
    expect(refusal({ TOOLMESH_TOKEN_URL: "not a url" }).message).toMatch(/TOOLMESH_TOKEN_URL/);
  });
});
