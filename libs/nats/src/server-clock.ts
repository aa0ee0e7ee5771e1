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
  #offset: number | undefined;

  /** @param window samples kept; default 64 */
  constructor(window = 64) {
    this.#window = window;
  }

  /** Feeds the server timestamp (epoch ms) of a message received at `localMs`. */
  observe(serverMs: number, localMs: number = Date.now()): void {
    this.#samples.push(localMs - serverMs);
    if (this.#samples.length > this.#window) this.#samples.shift();
    this.#offset = Math.min(...this.#samples);
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
}
