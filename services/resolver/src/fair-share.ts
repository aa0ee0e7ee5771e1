import type { JsMsg } from "@nats-io/jetstream";
import type { Logger } from "@toolmesh/telemetry";

// Fair share of a busy tool among tenants. While a tool's work stream holds as much as its
// executors can take (the window), further calls are not published to it: they stay unacknowledged
// in the calls stream, held by the resolver that took them, one queue per tenant, and are
// published in weighted round-robin order as the tool's work drains. Holding a call costs the
// server nothing new (no subject, consumer or stream per tenant): the call is a message the
// resolver consumer already delivered, kept owned by `working()`.

/** One call held for its turn. */
export interface HeldCall {
  /** `{tenant}.{session}.{call token}`: how its final message names it. */
  readonly id: string;
  readonly tenant: string;
  /** The calls-stream message, acknowledged once the call is handed on or answered. */
  readonly msg: JsMsg;
  /** Its deadline, ms on the server clock. */
  readonly deadlineAt: number;
  /** Publishes it to its tool's work and acknowledges it (or hands it back on failure). */
  dispatch(): Promise<void>;
  /** Answers it `deadline_exceeded` and acknowledges it. */
  expire(): Promise<void>;
}

/** How much of a tool's work is outstanding: not yet delivered plus delivered and unacknowledged. */
export type WorkDepth = (tool: string) => Promise<number>;

/** Options of {@link FairShare}. Durations in ms. */
export interface FairShareOptions {
  /**
   * Calls of one tool outstanding in the work stream (waiting or running) before further calls
   * are held for a fair turn: about what the tool's executors run at once, all replicas together.
   */
  window: number;
  /** Reads a tool's outstanding work (its work consumer's `num_pending + num_ack_pending`). */
  depth: WorkDepth;
  /** A tenant's share relative to others (default 1). */
  weightOf(tenant: string): number;
  /** The time, ms on the server clock. */
  now(): number;
  log: Logger;
  /** How long a read of a tool's depth is trusted, and how often a busy tool is looked at. Default 10. */
  pollMs?: number;
  /** How often held messages are told to the server as still owned; below the ack wait. */
  heartbeatMs: number;
  /** Most calls this process holds; beyond, calls go to the work stream in arrival order. Default 2 000. */
  maxHeld?: number;
}

interface TenantQueue {
  calls: HeldCall[];
  credit: number;
}

/** The held calls of one tool, a queue per tenant served in weighted round-robin. */
class ToolQueue {
  readonly tenants = new Map<string, TenantQueue>();
  order: string[] = [];
  cursor = 0;
  size = 0;
  depth = 0;
  depthAt = -Infinity;
  reading: Promise<void> | undefined;
  /** Whether a loop hands this tool's calls on; set and cleared with no await in between. */
  serving = false;
  /** Ends the loop's pause early (a call of the tool ended). */
  wake: (() => void) | undefined;

  push(call: HeldCall): void {
    let queue = this.tenants.get(call.tenant);
    if (queue === undefined) {
      queue = { calls: [], credit: 0 };
      this.tenants.set(call.tenant, queue);
      this.order.push(call.tenant);
    }
    queue.calls.push(call);
    this.size++;
  }

  /** The next call in weighted round-robin order (deficit round-robin over tenants). */
  next(weightOf: (tenant: string) => number): HeldCall | undefined {
    while (this.order.length > 0) {
      if (this.cursor >= this.order.length) this.cursor = 0;
      const tenant = this.order[this.cursor] as string;
      const queue = this.tenants.get(tenant) as TenantQueue;
      if (queue.credit < 1) queue.credit += weightOf(tenant);
      if (queue.credit >= 1) {
        queue.credit -= 1;
        const call = queue.calls.shift() as HeldCall;
        this.size--;
        if (queue.calls.length === 0) {
          this.tenants.delete(tenant);
          this.order.splice(this.cursor, 1);
        } else if (queue.credit < 1) this.cursor++;
        return call;
      }
      this.cursor++;
    }
    return undefined;
  }

  remove(call: HeldCall): boolean {
    const queue = this.tenants.get(call.tenant);
    const at = queue?.calls.indexOf(call) ?? -1;
    if (queue === undefined || at < 0) return false;
    queue.calls.splice(at, 1);
    this.size--;
    if (queue.calls.length === 0) {
      this.tenants.delete(call.tenant);
      const index = this.order.indexOf(call.tenant);
      this.order.splice(index, 1);
      if (index < this.cursor) this.cursor--;
    }
    return true;
  }
}

/**
 * Holds calls to busy tools and hands them on in a fair order. Nothing is lost: a held call is
 * an unacknowledged message of the calls stream, handed back when the resolver stops and
 * redelivered to another resolver when it dies. Deadlines are kept here while calls wait, and a
 * call whose final message goes by (a cancel) leaves the queue.
 */
export class FairShare {
  readonly #options: Required<FairShareOptions>;
  readonly #tools = new Map<string, ToolQueue>();
  readonly #held = new Map<string, { tool: string; call: HeldCall }>();
  readonly #heartbeat: NodeJS.Timeout;
  #stopped = false;

  constructor(options: FairShareOptions) {
    this.#options = { pollMs: 10, maxHeld: 2_000, ...options };
    this.#heartbeat = setInterval(() => {
      for (const { call } of this.#held.values()) call.msg.working();
    }, options.heartbeatMs).unref();
  }

  /** Calls held by this process now. */
  get held(): number {
    return this.#held.size;
  }

  /** Calls held by this process now, per tenant token. */
  heldByTenant(): Map<string, number> {
    const byTenant = new Map<string, number>();
    for (const { call } of this.#held.values())
      byTenant.set(call.tenant, (byTenant.get(call.tenant) ?? 0) + 1);
    return byTenant;
  }

  /**
   * Whether a call to `tool` must wait for its turn: calls of the tool are held already, or its
   * work is at the window. Reads the depth at most once per poll interval.
   */
  async busy(tool: string): Promise<boolean> {
    if (this.#stopped || this.#held.size >= this.#options.maxHeld) return false;
    const queue = this.#tools.get(tool);
    if (queue !== undefined && queue.size > 0) return true;
    const state = queue ?? this.#queue(tool);
    if (this.#options.now() - state.depthAt > this.#options.pollMs) {
      // One read serves every call arriving meanwhile.
      state.reading ??= this.#options
        .depth(tool)
        .then((depth) => {
          state.depth = depth;
          state.depthAt = this.#options.now();
        })
        .finally(() => (state.reading = undefined));
      try {
        await state.reading;
      } catch (err) {
        this.#options.log.warn({ err, tool }, "cannot read a tool's work depth; not holding");
        return false;
      }
    }
    if (state.depth >= this.#options.window) return true;
    // This call goes on to the work stream: count it until the next read sees it.
    state.depth++;
    return false;
  }

  /** Holds a call for its turn at `tool`. */
  hold(tool: string, call: HeldCall): void {
    if (this.#stopped) {
      call.msg.nak(500);
      return;
    }
    const queue = this.#tools.get(tool) ?? this.#queue(tool);
    queue.push(call);
    this.#held.set(call.id, { tool, call });
    if (!queue.serving) {
      queue.serving = true;
      void this.#serve(tool, queue);
    }
  }

  /**
   * A final message went by (`tool` as its message names it, when known): a held call it names
   * leaves its queue, acknowledged, and the tool's loop looks at its work again at once.
   */
  ended(id: string, tool?: string): void {
    if (tool !== undefined) this.#tools.get(tool)?.wake?.();
    const held = this.#held.get(id);
    if (held === undefined) return;
    this.#held.delete(id);
    if (this.#tools.get(held.tool)?.remove(held.call) === true) held.call.msg.ack();
  }

  /** Hands every held call back (`nak`), so another resolver takes it. */
  stop(): void {
    this.#stopped = true;
    clearInterval(this.#heartbeat);
    for (const { call } of this.#held.values()) call.msg.nak(500);
    this.#held.clear();
    this.#tools.clear();
  }

  #queue(tool: string): ToolQueue {
    const queue = new ToolQueue();
    this.#tools.set(tool, queue);
    return queue;
  }

  /**
   * Hands the tool's held calls on as its work drains, and expires those past their deadline.
   * Clears `serving` in the same turn as it sees the queue empty, so a call held after that
   * starts a new loop.
   */
  async #serve(tool: string, queue: ToolQueue): Promise<void> {
    try {
      await this.#drain(tool, queue);
    } catch (err) {
      this.#options.log.error({ err, tool }, "fair-share loop failed; handing its calls on again");
    }
    queue.serving = false;
    if (queue.size > 0 && !this.#stopped) {
      queue.serving = true;
      setTimeout(() => void this.#serve(tool, queue), this.#options.pollMs);
    }
  }

  async #drain(tool: string, queue: ToolQueue): Promise<void> {
    const { window, depth, pollMs, log, now } = this.#options;
    let swept = now();
    while (queue.size > 0 && !this.#stopped) {
      if (now() - swept >= 100) {
        swept = now();
        await this.#expire(queue);
      }
      let free = 0;
      try {
        queue.depth = await depth(tool);
        queue.depthAt = now();
        free = window - queue.depth;
      } catch (err) {
        log.warn({ err, tool }, "cannot read a tool's work depth; trying again");
      }
      // One round: the calls that fit, in turn, handed on together.
      const round: HeldCall[] = [];
      for (; free > 0; free--) {
        const call = queue.next((t) => this.#options.weightOf(t));
        if (call === undefined) break;
        this.#held.delete(call.id);
        round.push(call);
      }
      // Counted before they are published: a read of the depth meanwhile may not include them.
      queue.depth += round.length;
      await Promise.all(
        round.map((call) =>
          call.dispatch().catch((err: unknown) => {
            log.error({ err, call: call.id }, "cannot hand a held call on; it will be redelivered");
            call.msg.nak(1_000);
          }),
        ),
      );
      if (queue.size > 0) {
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, pollMs);
          queue.wake = () => {
            clearTimeout(timer);
            resolve();
          };
        });
        queue.wake = undefined;
      }
    }
  }

  async #expire(queue: ToolQueue): Promise<void> {
    const now = this.#options.now();
    const late: HeldCall[] = [];
    for (const { calls } of queue.tenants.values())
      for (const call of calls) if (call.deadlineAt <= now) late.push(call);
    for (const call of late) {
      queue.remove(call);
      this.#held.delete(call.id);
      await call.expire().catch((err: unknown) => {
        this.#options.log.error({ err, call: call.id }, "cannot answer a held call's deadline");
        call.msg.nak(1_000);
      });
    }
  }
}
