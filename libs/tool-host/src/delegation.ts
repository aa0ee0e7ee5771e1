import type { NatsConnection } from "@nats-io/nats-core";
import type { KV } from "@nats-io/kv";
import type { JetStreamManager } from "@nats-io/jetstream";
import { jetstreamManager } from "@nats-io/jetstream";
import type { Logger } from "@toolmesh/telemetry";
import { z } from "zod";
import { scanBucket, serveRequests } from "@toolmesh/nats";
import type { ServerClock } from "@toolmesh/nats";
import type { CallRecords } from "@toolmesh/call-store";
import {
  DelegationDepositSchema,
  ErrorCode,
  ToolmeshError,
  requestToken,
} from "@toolmesh/protocol";
import type {
  CallerIdentity,
  DelegationDeposit,
  ResolvedCall,
  Subjects,
  TokenEndpoint,
} from "@toolmesh/protocol";
import { openUserSecretsBucket } from "./user-secrets.js";
import type { SecretBox, UserSecretsBucketOptions } from "./user-secrets.js";

/** A `token-exchange` declaration: the downstream audience and the scopes asked for. */
export interface Delegation {
  audience: string;
  scopes: readonly string[];
}

/** A cached access token as sealed: the token and when it expires (server clock, epoch ms). */
const CachedTokenSchema = z.strictObject({ t: z.string(), exp: z.number() });

/** The keys of calls' grants in the bucket: `{tenant}.{subject}.{audience}.grant.{call}`. */
const GRANT_KEYS = "*.*.*.grant.*";

/** A cached token is used while it has this long left. */
const EXPIRY_MARGIN_MS = 30_000;

/** The clock cached tokens expire on: the server's, as every replica estimates it. */
type ExpiryClock = Pick<ServerClock, "now">;

/**
 * The delegated credentials of `token-exchange` tools, in the bucket of users' secrets of the
 * executor's account: each call's delegation grant (a refresh token the gateway obtained when
 * the call was submitted, deposited here and sealed), and access tokens per user and audience,
 * sealed and shared by the replicas until they expire. When a call runs, its grant buys a
 * fresh access token from the authorization server; when it ends, the grant is purged. A cached
 * token's expiry is written and read on the server's clock, so replicas whose hosts' clocks
 * disagree neither use a token past its end nor buy a fresh one early.
 */
export class DelegatedCredentials {
  readonly #kv: KV;
  readonly #jsm: JetStreamManager;
  readonly #box: SecretBox;
  readonly #subjects: Subjects;
  readonly #endpoint: TokenEndpoint;
  readonly #clock: ExpiryClock;

  private constructor(
    kv: KV,
    jsm: JetStreamManager,
    box: SecretBox,
    subjects: Subjects,
    endpoint: TokenEndpoint,
    clock: ExpiryClock,
  ) {
    this.#kv = kv;
    this.#jsm = jsm;
    this.#box = box;
    this.#subjects = subjects;
    this.#endpoint = endpoint;
    this.#clock = clock;
  }

  /** Opens the bucket of users' secrets (see {@link UserSecretsBucketOptions}). */
  static async open(
    nc: NatsConnection,
    subjects: Subjects,
    box: SecretBox,
    endpoint: TokenEndpoint,
    clock: ExpiryClock,
    bucket: UserSecretsBucketOptions = {},
  ): Promise<DelegatedCredentials> {
    const kv = await openUserSecretsBucket(nc, subjects, bucket);
    return new DelegatedCredentials(kv, await jetstreamManager(nc), box, subjects, endpoint, clock);
  }

  /**
   * Takes the gateway's deposits on `subjects.delegationDeposit(owner)`, one replica each (only
   * the gateway may publish there: the owner's account exports it to the mesh alone), and
   * sweeps the grants of ended calls at once and every `sweep.everyMs` (see {@link sweep}).
   */
  serve(
    nc: NatsConnection,
    owner: string | undefined,
    log: Logger,
    sweep: { records: CallRecords; horizonMs: number; everyMs: number },
  ): { stop(graceMs: number): Promise<void> } {
    const deposits = serveRequests({
      nc,
      subject: this.#subjects.delegationDeposit(owner),
      queue: "delegation",
      what: "delegation deposit",
      maxRequestBytes: 32_768,
      log,
      handle: async (body) => {
        await this.deposit(DelegationDepositSchema.parse(body));
        return { ok: true };
      },
    });
    let running: Promise<void> | undefined;
    const run = () => {
      running ??= this.sweep(sweep.records, sweep.horizonMs)
        .then((purged) => {
          if (purged > 0) log.info({ purged }, "purged the grants of calls that have ended");
        })
        .catch((err: unknown) => log.warn({ err }, "cannot sweep delegation grants; trying later"))
        .finally(() => (running = undefined));
    };
    run();
    const timer = setInterval(run, sweep.everyMs);
    timer.unref();
    return {
      stop: async (graceMs) => {
        clearInterval(timer);
        await Promise.all([running, deposits.stop(graceMs)]);
      },
    };
  }

  /** Seals and stores a call's grant, bound to its tenant, user, audience and call. */
  async deposit(d: DelegationDeposit): Promise<void> {
    const key = this.#grantKey(d.identity, d.audience, d.call_id);
    await this.#kv.put(key, this.#box.seal(d.grant, grantBinding(key, d.identity)));
  }

  /**
   * A valid access token for the call's user and `delegation.audience`: the cached one while it
   * lasts, else a fresh one bought with the call's grant. `credential_required` when the call
   * has no grant (no identity, no consent, submitted without a token) or the authorization
   * server refuses it (consent revoked).
   */
  async tokenFor(call: ResolvedCall, delegation: Delegation): Promise<string> {
    const identity = call.identity;
    if (identity === undefined)
      throw required(call.tool, "the call names no user: call it through the gateway signed in");
    const grantKey = this.#grantKey(identity, delegation.audience, call.call_id);
    const grant = await this.#open(grantKey, grantBinding(grantKey, identity));
    if (grant === undefined)
      throw required(
        call.tool,
        `no delegation of user "${identity.subject}" for ${delegation.audience} came with the call: the user must call through the gateway with a token the authorization server exchanges`,
      );
    const cacheKey = this.#subjects.delegatedTokenKey(
      identity.tenant,
      identity.subject,
      delegation.audience,
    );
    const cached = await this.#cached(cacheKey);
    if (cached !== undefined) return cached;
    const scope = delegation.scopes.join(" ");
    const res = await requestToken(
      this.#endpoint,
      {
        grant_type: "refresh_token",
        refresh_token: grant,
        resource: delegation.audience,
        ...(scope === "" ? {} : { scope }),
      },
      `a token of user "${identity.subject}" for ${delegation.audience}`,
    ).catch((err: unknown) => {
      if (err instanceof ToolmeshError && err.code === ErrorCode.CredentialRequired)
        throw required(call.tool, err.message);
      throw err;
    });
    if (res.refresh_token !== undefined && res.refresh_token !== grant)
      await this.#kv.put(
        grantKey,
        this.#box.seal(res.refresh_token, grantBinding(grantKey, identity)),
      );
    if (res.expires_in !== undefined) {
      const exp = this.#clock.now() + res.expires_in * 1000;
      await this.#kv.put(
        cacheKey,
        this.#box.seal(JSON.stringify({ t: res.access_token, exp }), cacheKey),
      );
    }
    return res.access_token;
  }

  /**
   * Purges the grants of calls that ended without their executor purging them (cancelled,
   * expired, denied before they ran, or an executor that died after ending them), and of calls
   * never stored. Only the gateway deposits grants, and its calls are their own session and
   * idempotency key, so a grant's key names its call's record. A grant whose call has no record
   * is kept for `horizonMs` after it was deposited: the longest a call may wait for approval and
   * then run (twice the call retention), so a queued call never loses its grant. Returns how
   * many grants were purged.
   */
  async sweep(records: CallRecords, horizonMs: number): Promise<number> {
    let purged = 0;
    // Message gets, not a key listing: listing fails on nats-server 2.9 while a node is down.
    const grants = await scanBucket(this.#jsm, this.#subjects.userSecretsBucket, GRANT_KEYS);
    for (const { key, created } of grants) {
      const [tenant, , , , call] = key.split(".");
      if (tenant === undefined || call === undefined) continue;
      const found = await records.get({
        idempotency_key: call,
        address: { tenant, session: call },
      });
      const ended =
        found === undefined
          ? this.#clock.now() - created.getTime() > horizonMs
          : found.record.state === "done";
      if (!ended) continue;
      await this.#kv.purge(key);
      purged++;
    }
    return purged;
  }

  /** Purges the call's grant: the call has ended. */
  async release(call: ResolvedCall, delegation: Delegation): Promise<void> {
    if (call.identity === undefined) return;
    await this.#kv.purge(this.#grantKey(call.identity, delegation.audience, call.call_id));
  }

  #grantKey(identity: CallerIdentity, audience: string, call: string): string {
    return this.#subjects.delegationGrantKey(identity.tenant, identity.subject, audience, call);
  }

  /** The value sealed under `key`, opened; undefined when there is none or it does not open. */
  async #open(key: string, binding: string): Promise<string | undefined> {
    const entry = await this.#kv.get(key);
    if (entry === null || entry.operation !== "PUT") return undefined;
    try {
      return this.#box.open(entry.string(), binding);
    } catch {
      return undefined;
    }
  }

  async #cached(key: string): Promise<string | undefined> {
    const sealed = await this.#open(key, key);
    if (sealed === undefined) return undefined;
    const parsed = CachedTokenSchema.safeParse(JSON.parse(sealed));
    if (!parsed.success || parsed.data.exp - EXPIRY_MARGIN_MS <= this.#clock.now())
      return undefined;
    return parsed.data.t;
  }
}

/** What a grant is bound to beyond its key: the issuer of the user it acts for. */
function grantBinding(key: string, identity: CallerIdentity): string {
  return `${key}\n${identity.issuer}`;
}

function required(tool: string, why: string): ToolmeshError {
  return new ToolmeshError(
    ErrorCode.CredentialRequired,
    `tool "${tool}" acts as the calling user with a delegated token, and ${why}`,
    { details: { tool, type: "token-exchange" } },
  );
}
