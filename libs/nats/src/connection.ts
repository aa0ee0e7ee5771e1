import { readFile } from "node:fs/promises";
import type { Authenticator, NatsConnection } from "@nats-io/nats-core";
import {
  TimeoutError,
  credsAuthenticator,
  nkeyAuthenticator,
  tokenAuthenticator,
  usernamePasswordAuthenticator,
} from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { ErrorCode, STREAM_LEADER_ELECTED_ADVISORIES, ToolmeshError } from "@toolmesh/protocol";
import { ReloadingFile } from "./reloading-file.js";

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
  /** Path of a PEM client certificate (TLS client authentication); needs `tlsKey`. */
  tlsCert?: string;
  /** Path of the PEM private key of `tlsCert`. */
  tlsKey?: string;
  /** Path of a PEM CA bundle the server's certificate is checked against. */
  tlsCa?: string;
  /** Inbox prefix; give each role its own so permissions can confine replies. */
  inboxPrefix?: string;
  /** How long the first connection may take, in ms. Default 20 000. */
  connectTimeoutMs?: number;
}

/** Lowest server version toolmesh runs on. */
export const MIN_SERVER_VERSION = "2.9.0";

/**
 * Connects with reconnection forever and the options meant for throughput, and follows server
 * restarts ({@link followServerChanges}). Files (creds, nkey seed, TLS) are read first, so a
 * missing one is reported by its option, and read again at every reconnection, so a rotated
 * file is used without a restart; a failure to connect is an `unavailable` error naming the
 * servers without their credentials and never carrying a secret.
 */
export async function connectNats(options: NatsConnectOptions = {}): Promise<NatsConnection> {
  const authenticator: Authenticator[] = [];
  if (options.creds !== undefined) {
    const creds = new ReloadingFile(options.creds, await readSecretFile(options.creds, "creds"));
    authenticator.push(credsAuthenticator(() => creds.read()));
  }
  if (options.nkey !== undefined) {
    const seed = new ReloadingFile(options.nkey, await readSecretFile(options.nkey, "nkey"));
    authenticator.push(nkeyAuthenticator(() => new TextEncoder().encode(seed.text())));
  }
  if (options.user !== undefined)
    authenticator.push(usernamePasswordAuthenticator(options.user, options.password));
  if (options.token !== undefined) authenticator.push(tokenAuthenticator(options.token));
  if ((options.tlsCert === undefined) !== (options.tlsKey === undefined)) {
    throw new ToolmeshError(
      ErrorCode.InvalidRequest,
      "a TLS client certificate needs its key and the key its certificate: set both NATS_CERT and NATS_KEY (--tlscert, --tlskey)",
      { retryable: false },
    );
  }
  // Read once here to report a missing file by its option; the transport reads the files again
  // for every connection attempt, so a renewed certificate is presented at the next reconnect.
  const tls: { certFile?: string; keyFile?: string; caFile?: string } = {};
  if (options.tlsCert !== undefined) {
    await readSecretFile(options.tlsCert, "tlscert");
    tls.certFile = options.tlsCert;
  }
  if (options.tlsKey !== undefined) {
    await readSecretFile(options.tlsKey, "tlskey");
    tls.keyFile = options.tlsKey;
  }
  if (options.tlsCa !== undefined) {
    await readSecretFile(options.tlsCa, "tlsca");
    tls.caFile = options.tlsCa;
  }
  const servers = (options.servers ?? "nats://127.0.0.1:4222").split(",").map((s) => s.trim());
  try {
    const nc = await connect({
      servers,
      ...(options.name === undefined ? {} : { name: options.name }),
      ...(options.inboxPrefix === undefined ? {} : { inboxPrefix: options.inboxPrefix }),
      ...(authenticator.length === 0 ? {} : { authenticator }),
      ...(Object.keys(tls).length === 0 ? {} : { tls }),
      ...(options.connectTimeoutMs === undefined ? {} : { timeout: options.connectTimeoutMs }),
      maxReconnectAttempts: -1,
      reconnectTimeWait: 250,
      // nats.js gives up after the same authentication error twice; a credential or certificate
      // refused now may be renewed in its file, which the next attempt reads, so keep trying
      // (liveness reports a process that stays refused: TOOLMESH_LIVENESS_DISCONNECTED_MS).
      ignoreAuthErrorAbort: true,
      noAsyncTraces: true,
    });
    followServerChanges(nc);
    return nc;
  } catch (err) {
    const reason = connectFailureReason(err);
    throw new ToolmeshError(
      ErrorCode.Unavailable,
      `cannot connect to NATS at ${servers.map(redactUrl).join(",")}: ${redactSecrets(reason, options)}`,
      // A refused credential stays refused; anything else (not started yet, restarting,
      // unreachable) may pass on a later attempt.
      { retryable: !/authori[sz]ation|authentication/i.test(reason) },
    );
  }
}

/** Why a first connection failed, for people: `host not found` rather than `getaddrinfo ENOTFOUND h`. */
function connectFailureReason(err: unknown): string {
  if ((err as { code?: unknown } | null)?.code === "ENOTFOUND") return "host not found";
  return err instanceof Error ? err.message : String(err);
}

/**
 * How long a request may still be waiting after a stream elected a new leader before it is taken
 * for one the old leader never answers, in ms. Answers of a live leader take milliseconds.
 */
const STUCK_AFTER_ELECTION_MS = 250;

/**
 * Keeps a connection's calls moving through a rolling restart of its servers and a lost stream
 * leader ([ADR 0042](../../../docs/adr/0042-calls-keep-moving-through-server-restarts.md)):
 *
 * - **Lame duck.** A server entering lame-duck mode (`nats-server --signal ldm`, the preStop
 *   hook of the NATS Helm chart) tells its clients so, then closes them one by one over
 *   `lame_duck_duration`; the connection moves to another server at once instead.
 * - **Lost replies.** Requests still waiting when the connection drops (PubAcks, KV writes,
 *   JetStream API calls) cannot be answered any more: their reply was addressed through the
 *   server that went away. nats.js would wait out each one's timeout (5 s for JetStream); they
 *   fail at once with the same `TimeoutError`, so callers retry as after a timeout, only sooner.
 * - **Lost requests.** Requests made while disconnected are not sent when the connection is
 *   back: nats.js discards what was written before each dial attempt. They fail as soon as it
 *   is back, the same way.
 * - **Requests the old leader took.** A stream leader that stopped or died does not answer what
 *   it had received; when a stream elects a new leader, publishes and message reads still
 *   waiting {@link STUCK_AFTER_ELECTION_MS} later fail the same way. (This needs the right to
 *   subscribe to `$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.>`; without it they wait out their
 *   timeout.)
 *
 * A retry is what a timeout already led to, so idempotency is unchanged.
 */
export function followServerChanges(nc: NatsConnection): void {
  failUnsentRequests(nc);
  void (async () => {
    for await (const status of nc.status()) {
      if (status.type === "disconnect") failRequests(nc, requestsInFlight(nc));
      else if (status.type === "ldm") await nc.reconnect().catch(() => undefined);
    }
  })();
  nc.subscribe(STREAM_LEADER_ELECTED_ADVISORIES, {
    callback: (err) => {
      if (err !== null) return;
      const waiting = requestsInFlight(nc).filter(answeredByStreamLeader);
      setTimeout(() => failRequests(nc, waiting), STUCK_AFTER_ELECTION_MS).unref();
    },
  });
}

/** Per connection: the subject prefixes whose unsent requests fail on reconnect (`all`: every one). */
const unsentWatches = new WeakMap<NatsConnection, { all: boolean; prefixes: Set<string> }>();

/**
 * Fails, as their timeout would, the requests made while the connection was down, once it is
 * back: nats.js discards what was written before each dial attempt, so they were never sent.
 * `prefixes` keeps it to requests on subjects starting with one of them (a library working on
 * its user's connection); without, every request. One watch per connection, however many ask.
 */
export function failUnsentRequests(nc: NatsConnection, prefixes?: readonly string[]): void {
  let watch = unsentWatches.get(nc);
  if (watch === undefined) {
    const watching = { all: false, prefixes: new Set<string>() };
    unsentWatches.set(nc, watching);
    watch = watching;
    const watched = (subject: string): boolean =>
      watching.all || [...watching.prefixes].some((prefix) => subject.startsWith(prefix));
    void (async () => {
      // Requests waiting as of the latest dial attempt: made before it, so discarded by it.
      let unsent: PendingRequest[] = [];
      for await (const status of nc.status()) {
        if (status.type === "reconnecting")
          unsent = requestsInFlight(nc).filter((r) => watched(r.requestSubject ?? ""));
        else if (status.type === "reconnect") failRequests(nc, unsent.splice(0));
      }
    })();
  }
  if (prefixes === undefined) watch.all = true;
  else for (const prefix of prefixes) watch.prefixes.add(prefix);
}

interface PendingRequest {
  requestSubject?: string;
  resolver(err: Error, msg: unknown): void;
}

/**
 * Whether a stream's leader answers the request in milliseconds: a publish to a stream (a PubAck,
 * a KV write) or a message read. Other JetStream API requests (creating or updating a stream or
 * consumer) are answered by the meta leader and may rightly take seconds while replicas move.
 */
function answeredByStreamLeader(request: PendingRequest): boolean {
  const subject = request.requestSubject ?? "";
  if (!subject.startsWith("$JS.")) return true;
  return subject.startsWith("$JS.API.DIRECT.GET.") || subject.startsWith("$JS.API.STREAM.MSG.GET.");
}

/** The requests waiting for their reply, from nats.js's request multiplexer. */
function requestsInFlight(nc: NatsConnection): PendingRequest[] {
  const mux = (nc as unknown as { protocol?: { muxSubscriptions?: { all?(): PendingRequest[] } } })
    .protocol?.muxSubscriptions;
  return mux?.all?.() ?? [];
}

/** Fails those of `requests` still waiting as their timeout would. */
function failRequests(nc: NatsConnection, requests: PendingRequest[]): void {
  if (requests.length === 0) return;
  const still = new Set(requestsInFlight(nc));
  for (const request of requests) if (still.has(request)) request.resolver(new TimeoutError(), {});
}

/** Server URL(s) as they may be shown: any `user:password@` replaced by `***@`. */
export function redactUrl(urls: string): string {
  return urls.replace(/(^|,|:\/\/)\s*[^@/,\s]*@/g, "$1***@");
}

function redactSecrets(text: string, options: NatsConnectOptions): string {
  let out = text;
  for (const secret of [options.password, options.token]) {
    if (secret !== undefined && secret.length > 0) out = out.split(secret).join("***");
  }
  for (const server of (options.servers ?? "").split(",")) {
    const trimmed = server.trim();
    if (trimmed !== "") out = out.split(trimmed).join(redactUrl(trimmed));
  }
  return out;
}

const OPTION_VARIABLES: Record<string, string> = {
  creds: "NATS_CREDS",
  nkey: "NATS_NKEY",
  tlscert: "NATS_CERT",
  tlskey: "NATS_KEY",
  tlsca: "NATS_CA",
};

async function readSecretFile(path: string, option: string): Promise<Uint8Array> {
  try {
    return await readFile(path);
  } catch (err) {
    throw new ToolmeshError(
      ErrorCode.InvalidRequest,
      `cannot read the ${OPTION_VARIABLES[option] ?? option} file (--${option}) ${path}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`,
      { retryable: false },
    );
  }
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
 * JetStream (unless `jetstream: false`: a tool owner's account has none). Returns the server
 * version.
 */
export async function assertServerSupported(
  nc: NatsConnection,
  options: { jetstream?: boolean } = {},
): Promise<string> {
  const version = nc.info?.version ?? "0.0.0";
  if (compareVersions(version, MIN_SERVER_VERSION) < 0) {
    throw new ToolmeshError(
      ErrorCode.Unavailable,
      `nats-server ${version} is too old: toolmesh needs ${MIN_SERVER_VERSION} or newer`,
      { retryable: false },
    );
  }
  if (options.jetstream === false) return version;
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
