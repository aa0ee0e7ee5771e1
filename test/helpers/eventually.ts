/** How {@link eventually} polls. Durations in ms. */
export interface EventuallyOptions {
  /** How long to poll before failing. Default 15 000. */
  timeoutMs?: number;
  /** How long to wait between two probes. Default 100. */
  everyMs?: number;
}

/**
 * Polls `probe` until it returns a value other than undefined, and returns it; fails naming
 * `what` (and the last thing `probe` threw, if it threw) after `timeoutMs`. What tests wait on
 * instead of sleeping: an observable state, not the passing of time.
 */
export async function eventually<T>(
  what: string,
  probe: () => T | undefined | Promise<T | undefined>,
  options: EventuallyOptions = {},
): Promise<T> {
  const deadline = Date.now() + (options.timeoutMs ?? 15_000);
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, options.everyMs ?? 100));
  }
}

/** Polls `check` until it holds; fails naming `what` after `timeoutMs` ({@link eventually}). */
export async function until(
  what: string,
  check: () => boolean | Promise<boolean>,
  options: EventuallyOptions = {},
): Promise<void> {
  await eventually(what, async () => ((await check()) ? true : undefined), options);
}

/** Rejects if `promise` has not settled within `ms`: a bound on a wait, not a sleep. */
export async function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: not done within ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}
