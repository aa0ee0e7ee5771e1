import { createHash, randomUUID } from "node:crypto";
import type { NatsConnection } from "@nats-io/nats-core";
import type { KV, KvEntry } from "@nats-io/kv";
import { Kvm } from "@nats-io/kv";
import type { Subjects } from "@toolmesh/protocol";
import { decodeJson, encodeJson } from "@toolmesh/protocol";
import { isWrongLastSequence } from "@toolmesh/nats";
import type { CredentialLimitsOptions, LimitRefusal } from "./limits.js";

/** The usage key prefix of the gateway's credentials in the quota usage bucket. */
export const GATEWAY_USAGE_PREFIX = "gateway";

/** What one credential uses, across every replica. */
interface CredentialUsage {
  /** Tokens left in its bucket, as of `at`. */
  tokens?: number;
  at?: number;
  /** Requests in flight: id → until when it counts if its replica never says it ended (ms). */
  in_flight: Record<string, number>;
}

/**
 * Per-credential rate and concurrency limits shared by every gateway replica: one entry per
 * credential in the quota usage bucket (`{p}_quota_usage`, key `gateway.{digest}`), changed only by
 * compare-and-set, as the resolvers' quotas are, so N replicas together admit the figures once.
 * A request of a replica that died counts until `holdMs` after it was admitted.
 */
export class MeshCredentialLimits {
  readonly #usage: KV;
  readonly #o: CredentialLimitsOptions & { holdMs: number };

  private constructor(usage: KV, options: CredentialLimitsOptions & { holdMs: number }) {
    this.#usage = usage;
    this.#o = options;
  }

  /** Binds the quota usage bucket (provisioned by `toolmesh setup` or the resolvers). */
  static async open(
    nc: NatsConnection,
    subjects: Subjects,
    options: CredentialLimitsOptions & { holdMs: number },
  ): Promise<MeshCredentialLimits> {
    const usage = await new Kvm(nc).open(subjects.quotaUsageBucket, {
      bindOnly: true,
      // Reads by key (direct get of its own keys): all the gateway may read of the bucket.
      allow_direct: true,
    });
    return new MeshCredentialLimits(usage, options);
  }

  /** Admits one request of the credential, or says why not; call the returned function when it ends. */
  async enter(tenant: string, credential: string): Promise<(() => void) | LimitRefusal> {
    const key = usageKey(tenant, credential);
    const id = randomUUID();
    let refusal: LimitRefusal | undefined;
    await this.#modify(key, (usage, now) => {
      refusal = this.#charge(usage, now, id);
      return refusal === undefined;
    });
    if (refusal !== undefined) return refusal;
    let left = false;
    return () => {
      if (left) return;
      left = true;
      void this.#modify(key, (usage) => {
        if (usage.in_flight[id] === undefined) return false;
        delete usage.in_flight[id];
        return true;
      }).catch(() => undefined); // counted until its hold ends
    };
  }

  /** Takes a token and a slot for `id`; the refusal when there is none. */
  #charge(usage: CredentialUsage, now: number, id: string): LimitRefusal | undefined {
    const { ratePerS, burst, maxConcurrent, holdMs } = this.#o;
    for (const [other, until] of Object.entries(usage.in_flight))
      if (until < now) delete usage.in_flight[other];
    let tokens: number | undefined;
    if (ratePerS > 0) {
      const last = usage.at ?? now;
      tokens = Math.min(
        burst,
        (usage.tokens ?? burst) + (Math.max(0, now - last) / 1_000) * ratePerS,
      );
      if (tokens < 1) return { reason: "rate", retryAfterS: Math.ceil((1 - tokens) / ratePerS) };
    }
    if (Object.keys(usage.in_flight).length >= maxConcurrent)
      return { reason: "concurrency", retryAfterS: 1 };
    if (tokens !== undefined) {
      usage.tokens = tokens - 1;
      usage.at = now;
    }
    usage.in_flight[id] = now + holdMs;
    return undefined;
  }

  /**
   * Reads the credential's usage, lets `change` edit it (false: nothing to write) and writes it
   * back only if no replica wrote in between; otherwise reads again.
   */
  async #modify(
    key: string,
    change: (usage: CredentialUsage, now: number) => boolean,
  ): Promise<void> {
    for (;;) {
      const entry: KvEntry | null = await this.#usage.get(key);
      const usage =
        entry?.operation === "PUT"
          ? ((decodeJson(entry.value) as CredentialUsage | null) ?? { in_flight: {} })
          : { in_flight: {} };
      usage.in_flight ??= {};
      if (!change(usage, Date.now())) return;
      try {
        if (entry === null) await this.#usage.create(key, encodeJson(usage));
        else await this.#usage.update(key, encodeJson(usage), entry.revision);
        return;
      } catch (err) {
        if (!isWrongLastSequence(err)) throw err;
      }
    }
  }
}

/** The usage key of a credential: its tenant and name digested (keys are subject tokens). */
function usageKey(tenant: string, credential: string): string {
  const digest = createHash("sha256").update(`${tenant}\n${credential}`, "utf8").digest("hex");
  return `${GATEWAY_USAGE_PREFIX}.${digest.slice(0, 32)}`;
}
