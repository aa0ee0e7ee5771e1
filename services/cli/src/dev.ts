import { randomBytes } from "node:crypto";
import { mkdtemp, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { NatsConnection } from "@nats-io/nats-core";
import type { Gateway, GatewayConfig } from "@toolmesh/gateway";
import { keyDigest, loadGatewayConfig, startGatewayFromRuntime } from "@toolmesh/gateway";
import { connectNats, redactUrl } from "@toolmesh/nats";
import { startNatsServer } from "@toolmesh/nats-launcher";
import type { NatsServerHandle } from "@toolmesh/nats-launcher";
import type { Runtime, RuntimeConfig, Stoppable } from "@toolmesh/runtime";
import { installShutdown, openRuntime, stopActor } from "@toolmesh/runtime";
import { createLogger } from "@toolmesh/telemetry";
import { ROLES, startActors } from "./actors.js";
import { connectLines } from "./connect-lines.js";
import { runDemo } from "./demo.js";
import { say } from "./print.js";

/** Options of `toolmesh dev`. */
export interface DevOptions {
  demo: boolean;
  exitAfterDemo: boolean;
  /** The environment (the gateway's variables). */
  env?: Readonly<Record<string, string | undefined>>;
}

/**
 * The dev gateway's configuration: the keys file of `TOOLMESH_GATEWAY_KEYS_FILE` when set, else a
 * development key for the dev tenant, made now and returned to be printed.
 */
async function devGatewayConfig(
  config: RuntimeConfig,
  env: Readonly<Record<string, string | undefined>>,
): Promise<{ gateway: GatewayConfig; key?: string }> {
  // One replica: a key of its own for the state of input_required requests (what the gateway
  // makes when none is set, without warning that other replicas could not read it).
  const stateKey = {
    TOOLMESH_GATEWAY_REQUEST_STATE_KEY:
      env.TOOLMESH_GATEWAY_REQUEST_STATE_KEY || randomBytes(32).toString("base64url"),
  };
  if (env.TOOLMESH_GATEWAY_KEYS_FILE !== undefined && env.TOOLMESH_GATEWAY_KEYS_FILE !== "")
    return { gateway: loadGatewayConfig(env, stateKey) };
  const key = `tmdev_${randomBytes(24).toString("base64url")}`;
  const dir = await mkdtemp(join(tmpdir(), "toolmesh-dev-gateway-"));
  const file = join(dir, "keys.json");
  await writeFile(
    file,
    JSON.stringify({ keys: [{ sha256: keyDigest(key), tenant: config.tenant, name: "dev" }] }),
    { mode: 0o600 },
  );
  return {
    gateway: loadGatewayConfig(env, { ...stateKey, TOOLMESH_GATEWAY_KEYS_FILE: file }),
    key,
  };
}

/** Starts the gateway on its port, or on any free port when that one is taken. */
async function startDevGateway(rt: Runtime, gateway: GatewayConfig): Promise<Gateway> {
  try {
    return await startGatewayFromRuntime(rt, gateway);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "EADDRINUSE") throw err;
    return startGatewayFromRuntime(rt, { ...gateway, port: 0 });
  }
}

async function reachable(config: RuntimeConfig): Promise<boolean> {
  let nc: NatsConnection | undefined;
  try {
    nc = await connectNats({ ...config.nats, name: "toolmesh-dev-probe" });
    return true;
  } catch {
    return false;
  } finally {
    await nc?.close();
  }
}

/**
 * `toolmesh dev`: every actor in this process against NATS_URL or, when nothing answers
 * there, against a nats-server with JetStream that it starts in a temp dir. Then the demo.
 */
export async function devCommand(config: RuntimeConfig, options: DevOptions): Promise<number> {
  let server: NatsServerHandle | undefined;
  if (!(await reachable(config))) {
    server = await startNatsServer();
    say(
      `no NATS answered at ${redactUrl(config.nats.servers)}; started nats-server ${server.url} (JetStream in ${server.storeDir})`,
    );
    config = { ...config, nats: { servers: server.url } };
  } else {
    say(`using NATS at ${redactUrl(config.nats.servers)}`);
  }
  // Logs go to stderr so the demo's output on stdout stays readable.
  const log = createLogger({ service: "dev", level: config.logLevel, destination: process.stderr });
  const { gateway: gatewayConfig, key } = await devGatewayConfig(config, options.env ?? {});
  const rt = await openRuntime(config, "dev", log);
  const meshActors = await startActors(
    rt,
    ROLES.filter((role) => role !== "gateway"),
  );
  const gateway = await startDevGateway(rt, gatewayConfig);
  const actors: Stoppable = {
    async stop(graceMs) {
      await Promise.all([gateway.stop(graceMs), meshActors.stop(graceMs)]);
    },
    inFlight: () => meshActors.inFlight?.() ?? [],
  };
  const shutdown = async (): Promise<boolean> => {
    const clean = await stopActor(rt, actors, config);
    await server?.stop();
    return clean;
  };
  say(`mesh running: ${ROLES.join(", ")} (tools from ${config.toolsDir})`);
  const host = gatewayConfig.host === "0.0.0.0" ? "127.0.0.1" : gatewayConfig.host;
  say(
    `MCP gateway: http://${host}:${gateway.port}/mcp` +
      (key === undefined
        ? ` (keys from ${gatewayConfig.keysFile ?? ""})`
        : ` (development key, tenant ${config.tenant}: Authorization: Bearer ${key})`),
  );
  for (const line of connectLines(config)) say(line);
  let code = 0;
  if (options.demo) {
    code = (await runDemo(rt.nc, { prefix: config.prefix, tenant: config.tenant })) === 0 ? 0 : 1;
  }
  if (options.exitAfterDemo) {
    await shutdown();
    return code;
  }
  say("\nPress Ctrl-C to stop.");
  installShutdown(log, shutdown);
  return new Promise<number>(() => undefined);
}
