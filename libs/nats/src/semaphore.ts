/** Counts free slots; `acquire` waits for one. */
export class Semaphore {
  #free: number;
  readonly #waiters: (() => void)[] = [];

  /** @param slots how many holders at once (at least 1) */
  constructor(slots: number) {
    this.#free = Math.max(1, Math.floor(slots));
  }

  /** Slots not held right now. */
  get free(): number {
    return this.#free;
  }

  /** Resolves once a slot is held; call {@link release} exactly once afterwards. */
  acquire(): Promise<void> {
    if (this.#free > 0) {
      this.#free--;
      return Promise.resolve();
    }
    return new Promise((resolve) => this.#waiters.push(resolve));
  }

  /** Gives a slot back, handing it straight to the oldest waiter. */
  release(): void {
    const next = this.#waiters.shift();
    if (next !== undefined) next();
    else this.#free++;
  }
}
