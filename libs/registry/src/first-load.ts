import { TimeoutError } from "@nats-io/nats-core";

/**
 * A new watcher's first delivery of a bucket's entries, bounded by silence rather than by total
 * time: a large registry may take long to load, but a watcher that delivers nothing for
 * `stallMs` (its consumer created and then silent, as after a server restart) is given up with
 * a retryable timeout, and one that ends before the last entry is given up at once.
 */
export class FirstLoad {
  /** Settles when the entries present at the start have all been seen, or the load failed. */
  readonly done: Promise<void>;
  readonly #bucket: string;
  readonly #stallMs: number;
  readonly #timer: NodeJS.Timeout;
  #seen = 0;
  #settled = false;
  #resolve!: () => void;
  #reject!: (err: Error) => void;

  constructor(bucket: string, stallMs: number) {
    this.#bucket = bucket;
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
        `the watcher of bucket ${this.#bucket} stopped after ${String(this.#seen)} entries, before delivering the rest; check that this connection may subscribe to its own inbox`,
      ),
    );
  }

  #stalled(): void {
    this.#settle(
      new Error(
        `the watcher of bucket ${this.#bucket} delivered nothing for ${String(this.#stallMs)} ms after ${String(this.#seen)} entries`,
        { cause: new TimeoutError() },
      ),
    );
  }

  #settle(err?: Error): void {
    if (this.#settled) return;
    this.#settled = true;
    clearTimeout(this.#timer);
    if (err === undefined) this.#resolve();
    else this.#reject(err);
  }
}
