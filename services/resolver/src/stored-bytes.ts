import type { NatsConnection, QueuedIterator, Subscription } from "@nats-io/nats-core";
import type { KV, KvEntry, KvWatchEntry } from "@nats-io/kv";
import { Kvm, KvWatchInclude } from "@nats-io/kv";
import type { Subjects } from "@toolmesh/protocol";
import { ErrorCode, ToolmeshError, decodeJson } from "@toolmesh/protocol";
import { modifyKvEntry } from "@toolmesh/nats";
import { finalSeen } from "@toolmesh/control-plane";
import type { Logger } from "@toolmesh/telemetry";

// What a tenant's calls have stored (ADR 0050): the bytes of every final message of its calls,
// which the sessions stream keeps for an hour and the call records for the call retention,
// counted in time slots covering the longer of the two, in the tenant's entry `{tenant}.stored`
// of `{p}_quota_usage`. One resolver of the queue group hears each final message as it is
// published (whoever ends the call: executor, owner services, deadline keeper, a refusal or the
// answer to a resubmission), adds its size up per tenant and writes the sum by compare-and-set
// every `flushMs`; every resolver watches the entries and refuses a tenant at its bound at
// admission, with no round trip.

/** Tenants' entries written at once by one flush. */
const WRITES_AT_ONCE = 64;

/** The queue group in which the resolvers share counting final messages. */
const QUEUE = "toolmesh-stored-bytes";

/** Slots a tenant's stored bytes are counted in; a slot is dropped once all it counts expired. */
const SLOTS = 24;

/** A tenant's entry: bytes per slot (slot index = server time / slot length). */
interface StoredEntry {
  slots: Record<string, number>;
}

/** The key of a tenant's stored bytes in the quota usage bucket. */
export function storedKey(tenant: string): string {
  return `${tenant}.stored`;
}

/** How long one slot lasts, for a retention, in ms. */
function slotMsOf(windowMs: number): number {
  return Math.max(1, Math.ceil(windowMs / SLOTS));
}

function decodeEntry(value: Uint8Array): StoredEntry {
  const raw = decodeJson(value) as Partial<StoredEntry> | null;
  return { slots: typeof raw?.slots === "object" && raw.slots !== null ? raw.slots : {} };
}

/**
 * A tenant's stored bytes at `now`: the slots not yet expired, and when the oldest of them
 * expires (ms from now; 0 when nothing is stored).
 */
export function storedNow(
  entry: StoredEntry,
  now: number,
  windowMs: number,
): { bytes: number; freesInMs: number } {
  const slotMs = slotMsOf(windowMs);
  let bytes = 0;
  let oldest = Infinity;
  for (const [slot, counted] of Object.entries(entry.slots)) {
    const expires = (Number(slot) + 1) * slotMs + windowMs;
    if (expires <= now) continue;
    bytes += counted;
    oldest = Math.min(oldest, expires);
  }
  return { bytes, freesInMs: bytes === 0 ? 0 : oldest - now };
}

/** Reads every tenant's stored bytes from the quota usage bucket: what `toolmesh stats` shows. */
export async function readStored(
  nc: NatsConnection,
  subjects: Subjects,
  options: { now: number; windowMs: number },
): Promise<Map<string, number>> {
  const usage = await new Kvm(nc).open(subjects.quotaUsageBucket);
  const found = new Map<string, number>();
  const keys: string[] = [];
  for await (const key of await usage.keys("*.stored")) keys.push(key);
  for (const key of keys) {
    const entry = await usage.get(key);
    if (entry?.operation !== "PUT") continue;
    const { bytes } = storedNow(decodeEntry(entry.value), options.now, options.windowMs);
    found.set(key.slice(0, -".stored".length), bytes);
  }
  return found;
}

/** Options of {@link StoredBytes.open}. */
export interface StoredBytesOptions {
  nc: NatsConnection;
  subjects: Subjects;
  /** Where final messages go by (`followedResults`): their republished headers, or themselves. */
  results: string;
  /** The quota usage bucket `{p}_quota_usage`. */
  usage: KV;
  /** A tenant's own bound (its quota's `max_stored_bytes`), if it has one. */
  boundOf: (tenant: string) => number | undefined;
  /** Every tenant's bound otherwise, in bytes; 0 bounds none. */
  defaultBound: number;
  /** How long what a call stores is kept: the longer of the call retention and the sessions', ms. */
  windowMs: number;
  /** How often the counted bytes are written, per tenant, in ms. Default 500. */
  flushMs?: number;
  /** The time, ms (the server clock). */
  now: () => number;
  log: Logger;
}

/** Counts what each tenant's calls store and refuses a tenant at its bound. */
export class StoredBytes {
  readonly #options: StoredBytesOptions;
  readonly #watcher: QueuedIterator<KvWatchEntry>;
  #results: Subscription | undefined;
  // Tenant → its entry as last seen, with its revision.
  readonly #entries = new Map<string, { entry: StoredEntry; revision: number }>();
  // Tenant → bytes counted here and not yet written.
  readonly #pending = new Map<string, number>();
  // Tenant → bytes being written now: still counted until the entry that holds them is known.
  readonly #writing = new Map<string, number>();
  #timer: NodeJS.Timeout | undefined;
  #flushing: Promise<void> = Promise.resolve();

  private constructor(options: StoredBytesOptions, watcher: QueuedIterator<KvWatchEntry>) {
    this.#options = options;
    this.#watcher = watcher;
  }

  /** Loads every tenant's entry, keeps watching them and starts writing what is counted. */
  static async open(options: StoredBytesOptions): Promise<StoredBytes> {
    const { usage } = options;
    // Updates from now on, then what is there: the higher revision of a key wins.
    const watcher = await usage.watch({ key: "*.stored", include: KvWatchInclude.UpdatesOnly });
    const ledger = new StoredBytes(options, watcher);
    void (async () => {
      for await (const entry of watcher) ledger.#seen(entry);
    })();
    const keys: string[] = [];
    for await (const key of await usage.keys("*.stored")) keys.push(key);
    for (const key of keys) {
      const entry = await usage.get(key);
      if (entry !== null) ledger.#seen(entry);
    }
    const { nc, subjects } = options;
    ledger.#results = nc.subscribe(options.results, {
      queue: QUEUE,
      callback: (err, msg) => {
        if (err !== null) {
          options.log.error({ err }, "cannot follow final messages to count stored bytes");
          return;
        }
        const final = finalSeen(msg, subjects);
        const settled = subjects.parseResultSubject(final.subject);
        if (settled !== undefined) ledger.add(settled.address.tenant, final.bytes);
      },
    });
    await nc.flush();
    const every = options.flushMs ?? 500;
    ledger.#timer = setInterval(() => void ledger.flush(), every).unref();
    return ledger;
  }

  /** Counts `bytes` a call of `tenant` stored (its final message). */
  add(tenant: string, bytes: number): void {
    this.#pending.set(tenant, (this.#pending.get(tenant) ?? 0) + bytes);
  }

  /** What a tenant has stored now (written and counted here), and its bound (0: none). */
  stored(tenant: string): { bytes: number; bound: number; freesInMs: number } {
    const bound = this.#options.boundOf(tenant) ?? this.#options.defaultBound;
    const entry = this.#entries.get(tenant)?.entry;
    const now = this.#options.now();
    const written =
      entry === undefined
        ? { bytes: 0, freesInMs: 0 }
        : storedNow(entry, now, this.#options.windowMs);
    const bytes =
      written.bytes + (this.#pending.get(tenant) ?? 0) + (this.#writing.get(tenant) ?? 0);
    const freesInMs =
      written.freesInMs > 0
        ? written.freesInMs
        : slotMsOf(this.#options.windowMs) + this.#options.windowMs;
    return { bytes, bound, freesInMs };
  }

  /** What every tenant known here has stored now, and its bound: what the metrics report. */
  readings(): { tenant: string; bytes: number; bound: number }[] {
    const tenants = new Set([
      ...this.#entries.keys(),
      ...this.#pending.keys(),
      ...this.#writing.keys(),
    ]);
    return [...tenants].map((tenant) => {
      const { bytes, bound } = this.stored(tenant);
      return { tenant, bytes, bound };
    });
  }

  /** `quota_exceeded` `storage` when the tenant is at its bound; a map read, no round trip. */
  refusal(tenant: string): ToolmeshError | undefined {
    const { bytes, bound, freesInMs } = this.stored(tenant);
    if (bound <= 0 || bytes < bound) return undefined;
    return new ToolmeshError(
      ErrorCode.QuotaExceeded,
      `tenant ${tenant} has stored ${bytes} bytes of results, its bound is ${bound}: retry in ` +
        `${Math.ceil(freesInMs / 60_000)} min, when its oldest results expire, or have an operator ` +
        `raise the bound (toolmesh quotas set ${tenant} --max-stored-bytes <bytes>)`,
      {
        retryable: true,
        details: {
          scope: tenant,
          quota: "storage",
          limit: "storage",
          max_stored_bytes: bound,
          stored_bytes: bytes,
          retry_after_ms: freesInMs,
        },
      },
    );
  }

  /** Writes what was counted since the last write (one compare-and-set per tenant). */
  flush(): Promise<void> {
    this.#flushing = this.#flushing.then(() => this.#write());
    return this.#flushing;
  }

  /** Writes what is left and stops watching. */
  async close(): Promise<void> {
    clearInterval(this.#timer);
    this.#results?.unsubscribe();
    await this.flush();
    this.#watcher.stop();
  }

  #seen(found: KvEntry): void {
    const tenant = found.key.slice(0, -".stored".length);
    const known = this.#entries.get(tenant);
    if (known !== undefined && known.revision >= found.revision) return;
    if (found.operation === "PUT")
      this.#entries.set(tenant, { entry: decodeEntry(found.value), revision: found.revision });
    else this.#entries.delete(tenant);
  }

  async #write(): Promise<void> {
    const batch = [...this.#pending];
    this.#pending.clear();
    for (const [tenant, bytes] of batch) this.#writing.set(tenant, bytes);
    // Tenants' entries are independent: written WRITES_AT_ONCE at a time, not one by one.
    for (let i = 0; i < batch.length; i += WRITES_AT_ONCE) {
      await Promise.all(
        batch.slice(i, i + WRITES_AT_ONCE).map(async ([tenant, bytes]) => {
          try {
            await this.#addTo(tenant, bytes);
          } catch (err) {
            // Kept for the next write: what a tenant stored is never forgotten by a failed write.
            this.add(tenant, bytes);
            this.#options.log.warn(
              { err, tenant },
              "cannot write a tenant's stored bytes; will retry",
            );
          } finally {
            this.#writing.delete(tenant);
          }
        }),
      );
    }
  }

  /** Adds `bytes` to the tenant's entry and keeps the entry written (its bytes now counted there). */
  async #addTo(tenant: string, bytes: number): Promise<void> {
    const { usage, windowMs } = this.#options;
    const key = storedKey(tenant);
    const written = await modifyKvEntry(
      usage,
      key,
      (value) => (value === undefined ? { slots: {} } : decodeEntry(value)),
      (entry) => {
        const now = this.#options.now();
        const slotMs = slotMsOf(windowMs);
        for (const slot of Object.keys(entry.slots))
          if ((Number(slot) + 1) * slotMs + windowMs <= now) delete entry.slots[slot];
        const slot = String(Math.floor(now / slotMs));
        entry.slots[slot] = (entry.slots[slot] ?? 0) + bytes;
        return true;
      },
    );
    const known = this.#entries.get(tenant);
    if (written !== undefined && (known === undefined || known.revision < written.revision))
      this.#entries.set(tenant, { entry: written.value, revision: written.revision });
  }
}
