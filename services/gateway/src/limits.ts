/** Options of {@link CredentialLimits}. */
export interface CredentialLimitsOptions {
  /** Requests one credential may have in flight at once. */
  maxConcurrent: number;
  /** Requests per second one credential may make on average (0: no limit). */
  ratePerS: number;
  /** Requests one credential may make at once above the rate. */
  burst: number;
}

interface Bucket {
  tokens: number;
  at: number;
  inFlight: number;
}

/** Why a request was refused by {@link CredentialLimits.enter}. */
export interface LimitRefusal {
  reason: "rate" | "concurrency";
  /** When to try again, in seconds. */
  retryAfterS: number;
}

/**
 * Per-credential concurrency and rate limits of one replica (a token bucket and an in-flight
 * count). They protect the replica; with N replicas a credential may use up to N times the
 * figures, as a load balancer spreads it.
 */
export class CredentialLimits {
  readonly #o: CredentialLimitsOptions;
  readonly #buckets = new Map<string, Bucket>();

  constructor(options: CredentialLimitsOptions) {
    this.#o = options;
  }

  /** Admits one request, or says why not; call the returned function when it ends. */
  enter(credential: string, now = Date.now()): (() => void) | LimitRefusal {
    let bucket = this.#buckets.get(credential);
    if (bucket === undefined) {
      bucket = { tokens: this.#o.burst, at: now, inFlight: 0 };
      this.#buckets.set(credential, bucket);
    }
    if (this.#o.ratePerS > 0) {
      bucket.tokens = Math.min(
        this.#o.burst,
        bucket.tokens + ((now - bucket.at) / 1_000) * this.#o.ratePerS,
      );
      bucket.at = now;
      if (bucket.tokens < 1)
        return { reason: "rate", retryAfterS: Math.ceil((1 - bucket.tokens) / this.#o.ratePerS) };
    }
    if (bucket.inFlight >= this.#o.maxConcurrent) return { reason: "concurrency", retryAfterS: 1 };
    if (this.#o.ratePerS > 0) bucket.tokens -= 1;
    bucket.inFlight += 1;
    const entered = bucket;
    let left = false;
    return () => {
      if (left) return;
      left = true;
      entered.inFlight -= 1;
    };
  }
}
