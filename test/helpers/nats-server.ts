// Integration tests start their own servers (random ports, temp storage); they never touch the
// shared NATS at 4222. TOOLMESH_TEST_NATS picks how: `process` (default) runs nats-server with
// the product's launcher, the one `toolmesh dev` uses; `container` runs it in a container
// through testcontainers (image: TOOLMESH_TEST_NATS_IMAGE, default the public nats:2.15.1-alpine, as docker-compose.yml).
// TOOLMESH_TEST_NATS_SERVER names the nats-server binary of `process` mode (a path; default
// the `nats-server` on PATH), e.g. /opt/nats-server-current/usr/sbin/nats-server.
import type {
  NatsClusterHandle,
  NatsServerHandle,
  StartNatsClusterOptions,
  StartNatsServerOptions,
} from "@toolmesh/nats-launcher";
import {
  startNatsCluster,
  startNatsServer as startProcess,
  stopAll as stopAllProcesses,
} from "@toolmesh/nats-launcher";
import { startContainerNatsServer, stopAllContainerNatsServers } from "./nats-container.js";

export { NatsServerStartError } from "@toolmesh/nats-launcher";
export type { NatsServerHandle, StartNatsServerOptions } from "@toolmesh/nats-launcher";

const mode = process.env.TOOLMESH_TEST_NATS || "process";
if (mode !== "process" && mode !== "container") {
  throw new Error(`TOOLMESH_TEST_NATS must be "process" or "container", not "${mode}"`);
}

/** How this run starts its servers. */
export const natsMode: "process" | "container" = mode;

const executable = process.env.TOOLMESH_TEST_NATS_SERVER || undefined;

/** Starts a JetStream-enabled server on random ports and resolves once it is healthy. */
export const startNatsServer: (opts?: StartNatsServerOptions) => Promise<NatsServerHandle> =
  natsMode === "container"
    ? startContainerNatsServer
    : (opts = {}) =>
        startProcess(
          executable === undefined || opts.executable !== undefined
            ? opts
            : { ...opts, executable },
        );

/** A cluster of local nats-server processes (three by default) of the chosen binary. */
export function startTestCluster(
  options: StartNatsClusterOptions = {},
): Promise<NatsClusterHandle> {
  return startNatsCluster(
    executable === undefined || options.executable !== undefined
      ? options
      : { ...options, executable },
  );
}

/** Kills every server (or removes every container) a test left running. */
export const stopAll: () => Promise<void> =
  natsMode === "container" ? stopAllContainerNatsServers : stopAllProcesses;

/** The server's counters of one named connection, from its `/connz` (`in_msgs`, `out_bytes`…). */
export async function connectionCounters(
  server: Pick<NatsServerHandle, "monitorUrl">,
  name: string,
): Promise<Record<string, number>> {
  const res = await fetch(`${server.monitorUrl}/connz?limit=1024`);
  const body = (await res.json()) as {
    connections: ({ name?: string } & Record<string, number>)[];
  };
  const conn = body.connections.find((c) => c.name === name);
  if (conn === undefined) throw new Error(`no connection named ${name}`);
  return conn;
}
