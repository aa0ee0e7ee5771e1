// Bytes in flight per tenant. What slows every tenant under one tenant's flood of large results
// is not that tenant's count of calls but the bytes it has moving at once: its arguments to the
// executors, its results through the sessions stream and the call records, all through one
// server. So each call this process starts is weighed by what it is expected to move, and a
// tenant with its bound or more in flight here waits — held, unacknowledged, on the fair-share
// path (`FairShare`'s gate) — until its calls end. Never refused: its calls keep their deadlines.
//
// A call's weight is the bytes of its calls-stream message (its arguments) plus what its
// tenant's results of the same tool lately weighed: a running average of their final messages
// (the first result sets it; before it, the arguments alone: a tenant's first burst to a tool is
// weighed by what it sends, so that calls of small results are never held for a guess). Averages
// are per tenant and tool, so no tenant moves another's. A tenant with nothing in flight may always start one call, so a
// call larger than the bound still runs, alone: a tenant has at most its bound plus one call in
// flight.

/** Options of {@link BytesInFlight}. */
export interface BytesInFlightOptions {
  /**
   * Bytes one tenant's calls may have in flight through this process before its further calls
   * wait (`TOOLMESH_TENANT_MAX_BYTES_IN_FLIGHT`); must be positive.
   */
  maxPerTenant: number;
  /** Most (tenant, tool) result averages kept; the oldest is forgotten beyond. Default 10 000. */
  maxAverages?: number;
}

/** A call counted in flight. */
interface Flying {
  readonly tenant: string;
  readonly tool: string;
  readonly bytes: number;
  readonly deadlineAt: number;
}

/** The weight of each new result in a running average. */
const LEARN = 0.25;

/** Follows each tenant's bytes in flight through this process, against its bound. */
export class BytesInFlight {
  /** Bytes a tenant may have in flight before its calls wait. */
  readonly max: number;
  readonly #maxAverages: number;
  readonly #calls = new Map<string, Flying>();
  readonly #tenants = new Map<string, number>();
  /** Average result bytes by `tenant` NUL `tool`, oldest first. */
  readonly #averages = new Map<string, number>();

  constructor(options: BytesInFlightOptions) {
    if (!(options.maxPerTenant > 0)) throw new RangeError("maxPerTenant must be positive");
    this.max = options.maxPerTenant;
    this.#maxAverages = options.maxAverages ?? 10_000;
  }

  /** What a call of `tenant` to `tool` with a message of `messageBytes` is expected to move. */
  weigh(tenant: string, tool: string, messageBytes: number): number {
    return messageBytes + Math.round(this.#averages.get(averageKey(tenant, tool)) ?? 0);
  }

  /** Whether `tenant`'s next call must wait: it has its bound or more in flight. */
  holds(tenant: string): boolean {
    return (this.#tenants.get(tenant) ?? 0) >= this.max;
  }

  /** Bytes `tenant` has in flight now. */
  inFlight(tenant: string): number {
    return this.#tenants.get(tenant) ?? 0;
  }

  /** Calls counted in flight now. */
  get calls(): number {
    return this.#calls.size;
  }

  /**
   * A call (`id`, as its final message names it) started: its `bytes` count until it ends, or
   * until a sweep after its deadline (`deadlineAt`, ms on the server clock).
   */
  started(id: string, tenant: string, tool: string, bytes: number, deadlineAt: number): void {
    if (this.#calls.has(id)) return;
    this.#calls.set(id, { tenant, tool, bytes, deadlineAt });
    this.#tenants.set(tenant, (this.#tenants.get(tenant) ?? 0) + bytes);
  }

  /**
   * A call ended (its final message, of `resultBytes` when known, went by; or it is no longer
   * followed): its bytes leave its tenant's count, and its result teaches its tool's average.
   */
  ended(id: string, resultBytes?: number): void {
    const call = this.#calls.get(id);
    if (call === undefined) return;
    this.#calls.delete(id);
    const left = (this.#tenants.get(call.tenant) ?? 0) - call.bytes;
    if (left > 0) this.#tenants.set(call.tenant, left);
    else this.#tenants.delete(call.tenant);
    if (resultBytes !== undefined) this.#learn(averageKey(call.tenant, call.tool), resultBytes);
  }

  /** Forgets the calls past their deadline at `now`: their final messages were missed. */
  sweep(now: number): void {
    for (const [id, call] of this.#calls) if (call.deadlineAt < now) this.ended(id);
  }

  /** Forgets every call in flight (their final messages may have been missed); keeps averages. */
  clear(): void {
    this.#calls.clear();
    this.#tenants.clear();
  }

  #learn(key: string, bytes: number): void {
    const before = this.#averages.get(key);
    // Re-inserted, so the map's order is the order of last use.
    this.#averages.delete(key);
    this.#averages.set(key, before === undefined ? bytes : before + LEARN * (bytes - before));
    if (this.#averages.size > this.#maxAverages) {
      const oldest = this.#averages.keys().next().value;
      if (oldest !== undefined) this.#averages.delete(oldest);
    }
  }
}

function averageKey(tenant: string, tool: string): string {
  return `${tenant}\u0000${tool}`;
}
