import { readFile } from "node:fs/promises";
import type { Authenticator, NatsConnection } from "@nats-io/nats-core";
import {
  credsAuthenticator,
  nkeyAuthenticator,
  tokenAuthenticator,
  usernamePasswordAuthenticator,
} from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { ErrorCode, ToolmeshError } from "@toolmesh/protocol";

/** How to reach NATS. Names follow natscli (`--server`, `--creds`, `--user`, …). */
export interface NatsConnectOptions {
  /** Server URL(s), comma-separated. Default `nats://127.0.0.1:4222`. */
  servers?: string;
  /** Connection name shown by the server's monitoring. */
  name?: string;
  /** Path of a `.creds` file (JWT + nkey seed). */
  creds?: string;
  /** Path of an nkey seed file. */
  nkey?: string;
  user?: string;
  password?: string;
  token?: string;
  /** Inbox prefix; give each role its own so permissions can confine replies. */
  inboxPrefix?: string;
}

/** Lowest server version toolmesh runs on. */
export const MIN_SERVER_VERSION = "2.9.0";

/** Connects with reconnection forever and the options meant for throughput. */
export async function connectNats(options: NatsConnectOptions = {}): Promise<NatsConnection> {
  const authenticator: Authenticator[] = [];
  if (options.creds !== undefined)
    authenticator.push(credsAuthenticator(await readFile(options.creds)));
  if (options.nkey !== undefined) {
    const seed = (await readFile(options.nkey, "utf8")).trim();
    authenticator.push(nkeyAuthenticator(new TextEncoder().encode(seed)));
  }
  if (options.user !== undefined)
    authenticator.push(usernamePasswordAuthenticator(options.user, options.password));
  if (options.token !== undefined) authenticator.push(tokenAuthenticator(options.token));
  return connect({
    servers: (options.servers ?? "nats://127.0.0.1:4222").split(",").map((s) => s.trim()),
    ...(options.name === undefined ? {} : { name: options.name }),
    ...(options.inboxPrefix === undefined ? {} : { inboxPrefix: options.inboxPrefix }),
    ...(authenticator.length === 0 ? {} : { authenticator }),
    maxReconnectAttempts: -1,
    reconnectTimeWait: 250,
    noAsyncTraces: true,
  });
}

/** Compares dotted versions numerically; negative when a < b. */
export function compareVersions(a: string, b: string): number {
  const pa = a.split(/[.-]/).map((p) => Number.parseInt(p, 10) || 0);
  const pb = b.split(/[.-]/).map((p) => Number.parseInt(p, 10) || 0);
  for (let i = 0; i < Math.max(pa.length, pb.length); i++) {
    const d = (pa[i] ?? 0) - (pb[i] ?? 0);
    if (d !== 0) return d;
  }
  return 0;
}

/**
 * Refuses, with a message that says what to do, a server that is too old or runs without
 * JetStream. Returns the server version.
 */
export async function assertServerSupported(nc: NatsConnection): Promise<string> {
  const version = nc.info?.version ?? "0.0.0";
  if (compareVersions(version, MIN_SERVER_VERSION) < 0) {
    throw new ToolmeshError(
      ErrorCode.Unavailable,
      `nats-server ${version} is too old: toolmesh needs ${MIN_SERVER_VERSION} or newer`,
      { retryable: false },
    );
  }
  // A leaf node without JetStream of its own passes the API on to its hub's: ask the API.
  await (async () => (await jetstreamManager(nc)).getAccountInfo())().catch((err: unknown) => {
    throw new ToolmeshError(
      ErrorCode.Unavailable,
      nc.info?.jetstream === true
        ? `JetStream is not available to this account: ${err instanceof Error ? err.message : String(err)}`
        : `nats-server ${version} at ${nc.getServer()} has JetStream disabled: start it with -js, or connect it as a leaf node to a hub that runs JetStream`,
      { retryable: false, cause: err },
    );
  });
  return version;
}
