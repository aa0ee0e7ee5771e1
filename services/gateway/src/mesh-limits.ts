import { createHash, randomUUID } from "node:crypto";
import type { NatsConnection } from "@nats-io/nats-core";
import type { KV } from "@nats-io/kv";
import { Kvm } from "@nats-io/kv";
import pRetry from "p-retry";
import type { Subjects } from "@toolmesh/protocol";
import { decodeJson } from "@toolmesh/protocol";
import { modifyKvEntry } from "@toolmesh/nats";
import type { Logger } from "@toolmesh/telemetry";
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

/** What {@link MeshCredentialLimits} is opened with. Durations in ms. */
export interface MeshLimitsOptions extends CredentialLimitsOptions {
  /** How long a request counts when its replica never says it ended. */
  holdMs: number;
  /** Where a request's end that could not be written yet is reported. */
  log?: Pick<Logger, "warn"> | undefined;
}

/** The longest pause between two tries of writing a request's end. */
const LEAVE_RETRY_MAX_MS = 5_000;

/** One change of a credential's entry: a request admitted or ended. */
interface Change {
  kind: "enter" | "leave";
  id: string;
  settle: (outcome: LimitRefusal | undefined | Error) => void;
}

/**
 * Per-credential rate and concurrency limits shared by every gateway replica: one entry per
 * credential in the quota usage bucket (`{p}_quota_usage`, key `gateway.{digest}`), changed only by
 * compare-and-set, as the resolvers' quotas are, so N replicas together admit the figures once.
 * A request of a replica that died counts until `holdMs` after it was admitted.
 */
export class MeshCredentialLimits {
  readonly #usage: KV;
  readonly #o: MeshLimitsOptions;
  /** Changes waiting for the next write of each key (present while a write is under way). */
  readonly #waiting = new Map<string, Change[]>();

  private constructor(usage: KV, options: MeshLimitsOptions) {
    this.#usage = usage;
    this.#o = options;
  }

  /** Binds the quota usage bucket (provisioned by `toolmesh setup` or the resolvers). */
  static async open(
    nc: NatsConnection,
    subjects: Subjects,
    options: MeshLimitsOptions,
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
    const refusal = await this.#queue(key, { kind: "enter", id });
    if (refusal !== undefined) return refusal;
    let left = false;
    const until = Date.now() + this.#o.holdMs;
    return () => {
      if (left) return;
      left = true;
      void this.#leave(key, id, until);
    };
  }

  /**
   * Writes a request's end. A write that fails (the server slow or away) is tried again, 100 ms
   * doubling to 5 s apart: a dropped end would hold the credential's slot until `until`, when
   * its hold ends and it stops counting anyway.
   */
  async #leave(key: string, id: string, until: number): Promise<void> {
    await pRetry(() => this.#queue(key, { kind: "leave", id }), {
      retries: Number.POSITIVE_INFINITY,
      minTimeout: 100,
      maxTimeout: LEAVE_RETRY_MAX_MS,
      randomize: false,
      // A retry pending at shutdown does not hold the process up.
      unref: true,
      maxRetryTime: Math.max(0, until - Date.now()),
      // Asked only when another try is due (time left): the warning says so.
      shouldRetry: ({ error }) => {
        this.#o.log?.warn(
          { err: error, key },
          "a request's end could not be written yet; trying again",
        );
        return true;
      },
    }).catch((err: unknown) =>
      this.#o.log?.warn(
        { err, key },
        "a request's end could not be written; its slot counts until its hold ends",
      ),
    );
  }

  /**
   * Queues a change of a credential's entry. While one write of the entry is under way, the
   * changes that arrive wait and go together in the next: one read and one write admit (or end)
   * all of them, and a replica races the others with one write at a time.
   */
  #queue(key: string, change: Omit<Change, "settle">): Promise<LimitRefusal | undefined> {
    return new Promise((resolve, reject) => {
      const waiting = this.#waiting.get(key);
      const entry: Change = {
        ...change,
        settle: (outcome) => (outcome instanceof Error ? reject(outcome) : resolve(outcome)),
      };
      if (waiting !== undefined) {
        waiting.push(entry);
        return;
      }
      this.#waiting.set(key, [entry]);
      void this.#write(key);
    });
  }

  /** Writes the waiting changes of a key, a batch at a time, until none waits. */
  async #write(key: string): Promise<void> {
    for (;;) {
      const batch = this.#waiting.get(key) ?? [];
      if (batch.length === 0) {
        this.#waiting.delete(key);
        return;
      }
      this.#waiting.set(key, []);
      const outcomes: (LimitRefusal | undefined)[] = [];
      try {
        await this.#modify(key, (usage, now) => {
          outcomes.length = 0;
          let changed = false;
          for (const change of batch) {
            if (change.kind === "leave") {
              changed ||= usage.in_flight[change.id] !== undefined;
              delete usage.in_flight[change.id];
              outcomes.push(undefined);
            } else {
              const refusal = this.#charge(usage, now, change.id);
              changed ||= refusal === undefined;
              outcomes.push(refusal);
            }
          }
          return changed;
        });
        batch.forEach((change, i) => change.settle(outcomes[i]));
      } catch (err) {
        const error = err instanceof Error ? err : new Error(String(err));
        for (const change of batch) change.settle(error);
      }
    }
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
    await modifyKvEntry(
      this.#usage,
      key,
      (value) => {
        const usage =
          value === undefined
            ? { in_flight: {} }
            : ((decodeJson(value) as CredentialUsage | null) ?? { in_flight: {} });
        usage.in_flight ??= {};
        return usage;
      },
      (usage) => change(usage, Date.now()),
    );
  }
}

/** The usage key of a credential: its tenant and name digested (keys are subject tokens). */
function usageKey(tenant: string, credential: string): string {
  const digest = createHash("sha256").update(`${tenant}\n${credential}`, "utf8").digest("hex");
  return `${GATEWAY_USAGE_PREFIX}.${digest.slice(0, 32)}`;
}
