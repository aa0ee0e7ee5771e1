/**
 * Estimates the NATS server's clock from JetStream message timestamps, so that deadlines are
 * kept on one clock (the server's) whatever the skew between the hosts of the services.
 *
 * Each delivered message gives `local receive time − server store time` = clock offset +
 * queueing and network delay. The smallest such sample over a recent window is the best
 * estimate of the offset (messages delivered at once carry almost no delay), as in NTP.
 */
export class ServerClock {
  readonly #samples: number[] = [];
  readonly #window: number;
  readonly #listeners = new Set<() => void>();
  #offset: number | undefined;
  #anchor: { offset: number; at: number } | undefined;

  /** @param window samples kept; default 64 */
  constructor(window = 64) {
    this.#window = window;
  }

  /** Feeds the server timestamp (epoch ms) of a message received at `localMs`. */
  observe(serverMs: number, localMs: number = Date.now()): void {
    this.#samples.push(localMs - serverMs);
    if (this.#samples.length > this.#window) this.#samples.shift();
    this.#update();
  }

  /**
   * Feeds a sample known to be fresh: the server timestamp of a message this process wrote
   * and read back at once (`localMs` when the read returned). Messages delivered from a
   * backlog all waited, and a window of them alone would put the server's clock seconds
   * behind; a fresh sample is kept for {@link ANCHOR_KEPT_MS} whatever the window holds.
   */
  anchor(serverMs: number, localMs: number = Date.now()): void {
    this.#anchor = { offset: localMs - serverMs, at: localMs };
    this.#update();
  }

  /** Calls `listener` whenever the estimate changes; returns the function that stops it. */
  onChange(listener: () => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  /** Local minus server clock, in ms; 0 before any message was seen. */
  get offsetMs(): number {
    return this.#offset ?? 0;
  }

  /** The server's clock now, as epoch ms. */
  now(localMs: number = Date.now()): number {
    return localMs - this.offsetMs;
  }

  /** Server time (epoch ms) at which a JetStream message was stored. */
  static timestampOf(msg: { info: { timestampNanos: number } }): number {
    return Math.floor(msg.info.timestampNanos / 1_000_000);
  }

  #update(): void {
    const anchor =
      this.#anchor !== undefined && Date.now() - this.#anchor.at < ANCHOR_KEPT_MS
        ? this.#anchor.offset
        : Number.POSITIVE_INFINITY;
    const lowest = Math.min(anchor, ...this.#samples);
    const offset = Number.isFinite(lowest) ? lowest : undefined;
    if (offset === this.#offset) return;
    this.#offset = offset;
    for (const listener of this.#listeners) listener();
  }
}

/** How long a fresh sample ({@link ServerClock.anchor}) counts, in ms: clocks drift slowly. */
export const ANCHOR_KEPT_MS = 600_000;
