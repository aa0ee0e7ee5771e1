import type { NatsConnection } from "@nats-io/nats-core";
import { connectNats, redactUrl } from "@toolmesh/nats";
import { startNatsServer } from "@toolmesh/nats-launcher";
import type { NatsServerHandle } from "@toolmesh/nats-launcher";
import type { RuntimeConfig } from "@toolmesh/runtime";
import { installShutdown, openRuntime, stopActor } from "@toolmesh/runtime";
import { createLogger } from "@toolmesh/telemetry";
import { ROLES, startActors } from "./actors.js";
import { runDemo } from "./demo.js";
import { say } from "./print.js";

/** Options of `toolmesh dev`. */
export interface DevOptions {
  demo: boolean;
  exitAfterDemo: boolean;
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
  const rt = await openRuntime(config, "dev", log);
  const actors = await startActors(rt, ROLES);
  const shutdown = async (): Promise<boolean> => {
    const clean = await stopActor(rt, actors, config);
    await server?.stop();
    return clean;
  };
  say(`mesh running: ${ROLES.join(", ")} (tools from ${config.toolsDir})`);
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
