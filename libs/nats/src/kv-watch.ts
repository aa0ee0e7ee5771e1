import type { QueuedIterator } from "@nats-io/nats-core";
import { TimeoutError } from "@nats-io/nats-core";
import type { KV, KvWatchEntry } from "@nats-io/kv";
import type { UnavailableKind } from "./unavailable.js";
import { retryWhileUnavailable } from "./unavailable.js";

/** Options of {@link watchLoaded}. Durations in ms. */
export interface WatchLoadedOptions {
  /** The keys to watch, as `kv.watch` filters them. Default every key. */
  key?: string;
  /**
   * How many entries are stored under `key` now (none: nothing to wait for), counted again before
   * each watcher is started. Default the bucket's count of messages (`kv.status()`).
   */
  stored?: () => Promise<number>;
  /** What is being loaded, for the final error: `load the tool registry`. */
  what: string;
  /**
   * How long the first load may go without an entry before the watcher is given up and another
   * started. Default 15 s: entries of a live consumer come in milliseconds.
   */
  stallMs?: number;
  /** How long to keep starting watchers ({@link retryWhileUnavailable}'s budget). */
  budgetMs?: number;
  /** Told once per kind of trouble met while starting watchers. */
  onRetry?: ((kind: UnavailableKind, err: unknown) => void) | undefined;
}

/**
 * Watches `kv` (the keys under `options.key`), handing every entry to `apply`, which must not
 * throw; resolves with the watcher once the entries stored when it started have all been applied.
 * A watcher that stalls on the way (its consumer created, then silent, as after a server
 * restart: nats.js's ordered consumer notices only after two missed 30 s heartbeats), or whose
 * creation fails in a way that heals by itself, is given up and another started, for at most
 * the budget; one that stops before the last entry (this connection may not subscribe to its
 * own inbox) fails at once.
 */
export function watchLoaded(
  kv: KV,
  apply: (entry: KvWatchEntry) => void,
  options: WatchLoadedOptions,
): Promise<QueuedIterator<KvWatchEntry>> {
  return retryWhileUnavailable(() => watchOnce(kv, apply, options), {
    what: options.what,
    ...(options.budgetMs === undefined ? {} : { budgetMs: options.budgetMs }),
    ...(options.onRetry !== undefined && { onRetry: options.onRetry }),
  });
}

async function watchOnce(
  kv: KV,
  apply: (entry: KvWatchEntry) => void,
  options: WatchLoadedOptions,
): Promise<QueuedIterator<KvWatchEntry>> {
  const stored = await (options.stored ?? (async () => (await kv.status()).values))();
  const watcher = await kv.watch({ key: options.key ?? ">" });
  const load =
    stored === 0
      ? undefined
      : new FirstLoad(watcher, options.what, options.stallMs ?? DEFAULT_STALL_MS);
  void (async () => {
    for await (const entry of watcher) {
      apply(entry);
      load?.saw(entry.delta === 0 || entry.isUpdate);
    }
    load?.ended();
  })();
  await load?.done;
  return watcher;
}

const DEFAULT_STALL_MS = 15_000;

/**
 * A new watcher's first delivery of a bucket's entries, bounded by silence rather than by total
 * time (a large bucket may take long to load): a watcher that delivers nothing for `stallMs` is
 * stopped and the load fails with a retryable timeout; one that ends before the last entry
 * fails the load at once.
 */
class FirstLoad {
  /** Settles when the entries present at the start have all been seen, or the load failed. */
  readonly done: Promise<void>;
  readonly #watcher: QueuedIterator<KvWatchEntry>;
  readonly #what: string;
  readonly #stallMs: number;
  readonly #timer: NodeJS.Timeout;
  #seen = 0;
  #settled = false;
  #resolve!: () => void;
  #reject!: (err: Error) => void;

  constructor(watcher: QueuedIterator<KvWatchEntry>, what: string, stallMs: number) {
    this.#watcher = watcher;
    this.#what = what;
    this.#stallMs = stallMs;
    this.done = new Promise<void>((resolve, reject) => {
      this.#resolve = resolve;
      this.#reject = reject;
    });
    this.#timer = setTimeout(() => this.#stalled(), stallMs);
  }

  /** One entry was delivered; `last` when it was the last of those present at the start. */
  saw(last: boolean): void {
    if (this.#settled) return;
    this.#seen += 1;
    if (last) this.#settle();
    else this.#timer.refresh();
  }

  /** The watcher stopped: before the last entry, the load failed. */
  ended(): void {
    this.#settle(
      new Error(
        `the watcher to ${this.#what} stopped after ${String(this.#seen)} entries, before delivering the rest; check that this connection may subscribe to its own inbox`,
      ),
    );
  }

  #stalled(): void {
    this.#settle(
      new Error(
        `the watcher to ${this.#what} delivered nothing for ${String(this.#stallMs)} ms after ${String(this.#seen)} entries`,
        { cause: new TimeoutError() },
      ),
    );
  }

  #settle(err?: Error): void {
    if (this.#settled) return;
    this.#settled = true;
    clearTimeout(this.#timer);
    if (err === undefined) {
      this.#resolve();
      return;
    }
    this.#watcher.stop();
    this.#reject(err);
  }
}
