import type { JsMsg } from "@nats-io/jetstream";
import type { Logger } from "@toolmesh/telemetry";

// Fair share of a busy tool among tenants. While a tool's work stream holds as much as its
// executors can take (the window), further calls are not published to it: they stay unacknowledged
// in the calls stream, held by the resolver that took them, one queue per tenant, and are
// published as the tool's work drains. Holding a call costs the server nothing new (no subject,
// consumer or stream per tenant): the call is a message the resolver consumer already delivered,
// kept owned by `working()`.
//
// The window's slots are shared, not only the order (max-min fair share of the tool's
// concurrency, weighted): a freed slot goes to the waiting tenant with the fewest calls running
// for its weight, round-robin among equals. And a tenant seen at the tool within the idle time
// keeps free as many slots as it lately had calls running and waiting at once (at least one, at
// most its share of the window), so its next calls start at once instead of waiting for calls of
// another tenant's backlog to end: a running call cannot be taken back. A tenant with nothing
// running may always take a free slot, so a busy tenant always keeps one.

/** One call held for its turn. */
export interface HeldCall {
  /** `{tenant}.{session}.{call token}`: how its final message names it. */
  readonly id: string;
  /** The call's id, as the caller gave it: what its log lines are found by. */
  readonly callId?: string;
  readonly tenant: string;
  /** The calls-stream message, acknowledged once the call is handed on or answered. */
  readonly msg: JsMsg;
  /** Its deadline, ms on the server clock. */
  readonly deadlineAt: number;
  /** The bytes it is expected to move, for the {@link TenantGate}. */
  readonly bytes?: number;
  /** Publishes it to its tool's work and acknowledges it (or hands it back on failure). */
  dispatch(): Promise<void>;
  /** Answers it `deadline_exceeded` and acknowledges it. */
  expire(): Promise<void>;
}

/**
 * What else makes a tenant's calls wait, whatever the tool's window (its bytes in flight): told
 * of every call this process starts, as it starts, and of every call it stops following.
 */
export interface TenantGate {
  /** Whether `tenant`'s next call must wait. */
  holds(tenant: string): boolean;
  /** A call started; `deadlineAt` (ms on the server clock) ends its count if nothing else does. */
  started(id: string, tenant: string, tool: string, bytes: number, deadlineAt: number): void;
  /** The call ended; `resultBytes`, its final message's size, when it was seen. */
  ended(id: string, resultBytes?: number): void;
  /** Forgets the calls past their deadline: their final messages were missed, or never came. */
  sweep(now: number): void;
  /** Forgets every call (after a reconnect, or on stop). */
  clear(): void;
}

/** A call as the gate counts it: its id (as its final message names it) and expected bytes. */
export interface GatedCall {
  readonly id: string;
  readonly bytes: number;
  /** Its deadline, ms on the server clock. */
  readonly deadlineAt: number;
}

/** How much of a tool's work is outstanding: not yet delivered plus delivered and unacknowledged. */
export type WorkDepth = (tool: string) => Promise<number>;

/** Options of {@link FairShare}. Durations in ms. */
export interface FairShareOptions {
  /**
   * Calls of one tool outstanding in the work stream (waiting or running) before further calls
   * are held for a fair turn: about what the tool's executors run at once, all replicas together.
   * A number for every tool, or read per tool (its announced capacity, ADR 0055); a tool whose
   * window is 0 is not held.
   */
  window: number | ((tool: string) => number);
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
  /**
   * How long after its last call of a tool (arriving or ending) a tenant keeps slots of the window
   * free for its next calls; 0 keeps none. Default 1 000.
   */
  idleMs?: number;
  /** Holds a tenant's calls whatever the window while it says so; none when undefined. */
  gate?: TenantGate | undefined;
}

/** A call this process published to its tool's work: its tenant and deadline. */
export interface StartedCall {
  readonly id: string;
  readonly tenant: string;
  readonly deadlineAt: number;
  /** The bytes it is expected to move, for the {@link TenantGate}. */
  readonly bytes?: number;
}

/** A tenant's use of one tool through this process. */
interface TenantActivity {
  /** Calls published by this process and not ended. */
  running: number;
  /** When a call of the tenant last arrived or ended, ms on the server clock. */
  lastAt: number;
  /** The most calls it had running and held at once lately, and when it last had that many. */
  peak: number;
  peakAt: number;
}

interface TenantQueue {
  calls: HeldCall[];
}

/**
 * The held calls of one tool, a queue per tenant: the tenant with the fewest calls running for
 * its weight goes first, in round-robin order among equals.
 */
/** How long a call let through may take to start before it is no longer counted, in ms. */
const ADMITTING_MS = 5_000;

class ToolQueue {
  constructor(readonly tool: string) {}
  readonly tenants = new Map<string, TenantQueue>();
  /** Tenants with calls of the tool running, or recently seen. */
  readonly activity = new Map<string, TenantActivity>();
  order: string[] = [];
  cursor = 0;
  size = 0;
  /** Calls of the tool this process published and has not seen end. */
  running = 0;
  /**
   * When each call let through by {@link FairShare.busy} and not started yet was let through:
   * between the two its quota and record are written, and it is in neither the server's depth
   * nor `running`, so a read of the depth meanwhile must add it.
   */
  admitting: number[] = [];
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
      queue = { calls: [] };
      this.tenants.set(call.tenant, queue);
      this.order.push(call.tenant);
    }
    queue.calls.push(call);
    this.size++;
  }

  /**
   * The next call, among the tenants that `mayStart`: the first, from the cursor on, of those
   * with the fewest calls `running` for their weight (max-min fair share of the tool's slots,
   * weighted); undefined when no tenant may start.
   */
  next(
    weightOf: (tenant: string) => number,
    running: (tenant: string) => number,
    mayStart: (tenant: string) => boolean,
  ): HeldCall | undefined {
    const n = this.order.length;
    let best = -1;
    let least = Infinity;
    for (let i = 0; i < n; i++) {
      const at = (this.cursor + i) % n;
      const tenant = this.order[at] as string;
      if (!mayStart(tenant)) continue;
      const share = running(tenant) / weightOf(tenant);
      if (share < least) {
        least = share;
        best = at;
      }
    }
    if (best < 0) return undefined;
    const tenant = this.order[best] as string;
    const queue = this.tenants.get(tenant) as TenantQueue;
    const call = queue.calls.shift() as HeldCall;
    this.size--;
    if (queue.calls.length === 0) {
      this.tenants.delete(tenant);
      this.order.splice(best, 1);
      this.cursor = best;
    } else this.cursor = best + 1;
    return call;
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
  readonly #options: Required<Omit<FairShareOptions, "gate">>;
  readonly #gate: TenantGate | undefined;
  readonly #tools = new Map<string, ToolQueue>();
  readonly #held = new Map<string, { tool: string; call: HeldCall }>();
  /** Calls this process published and has not seen end, by id. */
  readonly #started = new Map<string, { tool: string; call: StartedCall }>();
  readonly #heartbeat: NodeJS.Timeout;
  #stopped = false;

  constructor(options: FairShareOptions) {
    this.#options = {
      ...options,
      pollMs: options.pollMs ?? 10,
      maxHeld: options.maxHeld ?? 2_000,
      idleMs: options.idleMs ?? 1_000,
    };
    this.#gate = options.gate;
    this.#heartbeat = setInterval(() => {
      for (const { call } of this.#held.values()) call.msg.working();
      // A final message this process missed (it was disconnected) ends the count at the deadline.
      const now = this.#options.now();
      for (const [id, { call }] of this.#started) if (call.deadlineAt < now) this.#giveBack(id);
      this.#gate?.sweep(now);
      const since = now - this.#options.idleMs;
      for (const queue of this.#tools.values())
        for (const [tenant, { running, lastAt }] of queue.activity)
          if (running === 0 && lastAt <= since && !queue.tenants.has(tenant))
            queue.activity.delete(tenant);
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
   * Whether a call of `tenant` to `tool` must wait for its turn: the gate holds the tenant, calls
   * of the tool are held already, or no slot of the window is free for the tenant
   * ({@link #mayStart}). Reads the depth at most once per poll interval. A `call` let through is
   * counted by the gate at once (given back with the gate's `ended` if it is not routed).
   */
  async busy(tool: string, tenant: string, call?: GatedCall): Promise<boolean> {
    if (this.#stopped || this.#held.size >= this.#options.maxHeld)
      return this.#letThrough(tool, tenant, call);
    const state = this.#tools.get(tool) ?? this.#queue(tool);
    this.#seen(state, tenant);
    if (this.#gate?.holds(tenant) === true) return true;
    // Calls held only by the gate make no one else wait.
    if (state.size > 0 && this.#waitingForSlots(state)) return true;
    // A tool of unknown capacity (no executor announces it) is not held.
    if (this.#window(tool) <= 0) return this.#letThrough(tool, tenant, call);
    if (this.#options.now() - state.depthAt > this.#options.pollMs) {
      // One read serves every call arriving meanwhile.
      state.reading ??= this.#options
        .depth(tool)
        .then((depth) => {
          state.depth = Math.max(depth, state.running) + this.#admitting(state);
          state.depthAt = this.#options.now();
        })
        .finally(() => (state.reading = undefined));
      try {
        await state.reading;
      } catch (err) {
        this.#options.log.warn({ err, tool }, "cannot read a tool's work depth; not holding");
        return this.#letThrough(tool, tenant, call);
      }
    }
    // Asked again after the read: calls let through meanwhile count.
    if (!this.#mayStart(state, state.depth)(tenant) || this.#gate?.holds(tenant) === true)
      return true;
    // This call goes on to the work stream: count it until the next read sees it, and until it
    // starts in every read.
    state.depth++;
    state.admitting.push(this.#options.now());
    return this.#letThrough(tool, tenant, call);
  }

  /**
   * Lets a call through: the gate counts it at once, in the same turn as it was asked, so calls
   * arriving together cannot all pass it (`false`, for {@link busy}).
   */
  #letThrough(tool: string, tenant: string, call: GatedCall | undefined): false {
    if (call !== undefined) this.#gate?.started(call.id, tenant, tool, call.bytes, call.deadlineAt);
    return false;
  }

  /**
   * A call {@link busy} let through goes on to its tool's work: counted as running for its tenant
   * until its final message goes by ({@link ended}) or its deadline passes.
   */
  started(tool: string, call: StartedCall): void {
    if (this.#stopped || this.#started.has(call.id)) return;
    const queue = this.#tools.get(tool) ?? this.#queue(tool);
    // It is running now, no longer being let through.
    queue.admitting.shift();
    this.#start(tool, queue, call);
  }

  #start(tool: string, queue: ToolQueue, call: StartedCall): void {
    const activity = this.#seen(queue, call.tenant);
    activity.running++;
    queue.running++;
    this.#demand(queue, call.tenant, activity);
    this.#started.set(call.id, { tool, call });
    this.#gate?.started(call.id, call.tenant, tool, call.bytes ?? 0, call.deadlineAt);
  }

  /** Whether a tenant the gate lets go has calls of the tool held. */
  #waitingForSlots(queue: ToolQueue): boolean {
    const gate = this.#gate;
    if (gate === undefined) return true;
    for (const tenant of queue.tenants.keys()) if (!gate.holds(tenant)) return true;
    return false;
  }

  /**
   * Holds a call for its turn at `tool`. A call held already (the server delivered it again: its
   * heartbeats were lost, as in a server restart) is held once, as its newest delivery, the one
   * the server now waits for: a second copy would be handed on after the first ended, counted as
   * running with no final message to come, and keep a slot of the window until its deadline.
   */
  hold(tool: string, call: HeldCall): void {
    if (this.#stopped) {
      call.msg.nak(500);
      return;
    }
    const earlier = this.#held.get(call.id);
    if (earlier !== undefined) this.#tools.get(earlier.tool)?.remove(earlier.call);
    const queue = this.#tools.get(tool) ?? this.#queue(tool);
    queue.push(call);
    this.#demand(queue, call.tenant, this.#seen(queue, call.tenant));
    this.#held.set(call.id, { tool, call });
    if (!queue.serving) {
      queue.serving = true;
      void this.#serve(tool, queue);
    } else queue.wake?.();
  }

  /**
   * A final message went by (`toolOf` reads the tool its message names, asked only for a call
   * this process did not start; `resultBytes`, its size, when seen): the call's slot is free, a
   * held call it names leaves its queue, acknowledged, and the tool's loop looks at its work
   * again at once.
   */
  ended(id: string, toolOf?: () => string | undefined, resultBytes?: number): void {
    if (!this.#giveBack(id, resultBytes) && this.#held.size > 0) {
      const tool = toolOf?.();
      if (tool !== undefined) this.#tools.get(tool)?.wake?.();
    }
    const held = this.#held.get(id);
    if (held === undefined) return;
    this.#held.delete(id);
    if (this.#tools.get(held.tool)?.remove(held.call) === true) held.call.msg.ack();
  }

  /**
   * A call counted as started did not go on after all (publishing its work failed; the server
   * delivers it again): its slot and bytes are given back. Unlike {@link ended}, a delivery of
   * it held meanwhile stays held: the call has not ended, and that delivery is the one the
   * server now waits for.
   */
  notStarted(id: string): void {
    this.#giveBack(id);
  }

  /** Gives back what a started call holds (its slot, its bytes); false when none was started. */
  #giveBack(id: string, resultBytes?: number): boolean {
    // The gate may count a call let through and not started yet.
    this.#gate?.ended(id, resultBytes);
    const started = this.#started.get(id);
    if (started === undefined) return false;
    this.#started.delete(id);
    const queue = this.#tools.get(started.tool);
    const activity = queue?.activity.get(started.call.tenant);
    if (queue !== undefined) queue.running--;
    if (activity !== undefined) {
      activity.running--;
      activity.lastAt = this.#options.now();
      this.#demand(queue as ToolQueue, started.call.tenant, activity);
    }
    queue?.wake?.();
    return true;
  }

  /**
   * Forgets the calls this process published: after a reconnect, final messages published while
   * it was disconnected were never seen, and would hold their slots until their deadlines.
   */
  reconnected(): void {
    this.#started.clear();
    this.#gate?.clear();
    for (const queue of this.#tools.values()) {
      queue.running = 0;
      for (const activity of queue.activity.values()) activity.running = 0;
    }
  }

  /** Hands every held call back (`nak`), so another resolver takes it. */
  stop(): void {
    this.#stopped = true;
    clearInterval(this.#heartbeat);
    for (const { call } of this.#held.values()) call.msg.nak(500);
    this.#held.clear();
    this.#started.clear();
    this.#gate?.clear();
    this.#tools.clear();
  }

  #window(tool: string): number {
    const { window } = this.#options;
    return typeof window === "number" ? window : window(tool);
  }

  #queue(tool: string): ToolQueue {
    const queue = new ToolQueue(tool);
    this.#tools.set(tool, queue);
    return queue;
  }

  /** Notes a call of `tenant` arriving at the tool. */
  #seen(queue: ToolQueue, tenant: string): TenantActivity {
    const now = this.#options.now();
    let activity = queue.activity.get(tenant);
    if (activity === undefined) {
      activity = { running: 0, lastAt: now, peak: 0, peakAt: now };
      queue.activity.set(tenant, activity);
    } else activity.lastAt = now;
    return activity;
  }

  /** Notes what `tenant` runs and holds now in its peak within the idle time. */
  #demand(queue: ToolQueue, tenant: string, activity: TenantActivity): void {
    const now = this.#options.now();
    const demand = activity.running + (queue.tenants.get(tenant)?.calls.length ?? 0);
    if (demand >= activity.peak || now - activity.peakAt > this.#options.idleMs) {
      activity.peak = demand;
      activity.peakAt = now;
    }
  }

  /**
   * Which tenants may take a slot of the window with `depth` outstanding. A slot must be free. A
   * tenant with nothing of the tool running may take it; one with calls running only if a slot
   * then stays free for each call another tenant may claim: a tenant with calls held, or seen
   * within the idle time, claims as many slots as it lately had calls running and held at once
   * (at least one), up to its weighted share of the window (at least one), less what it runs.
   * Tenants seen longer ago with nothing running or held are forgotten on the way.
   */
  #mayStart(queue: ToolQueue, depth: number): (tenant: string) => boolean {
    const { idleMs, now, weightOf } = this.#options;
    const window = this.#window(queue.tool);
    // No capacity announced (any more): the held calls go on in turn, as unheld ones do.
    if (window <= 0) return () => true;
    const free = window - depth;
    if (free <= 0) return () => false;
    const runs = (tenant: string) => (queue.activity.get(tenant)?.running ?? 0) > 0;
    if (idleMs <= 0) return () => true;
    const since = now() - idleMs;
    let weights = 0;
    for (const [tenant, activity] of queue.activity) {
      if (activity.running === 0 && activity.lastAt <= since && !queue.tenants.has(tenant))
        queue.activity.delete(tenant);
      else weights += weightOf(tenant);
    }
    const claims = new Map<string, number>();
    let claimed = 0;
    for (const [tenant, { running, peak, peakAt }] of queue.activity) {
      // A tenant its gate holds claims no slot: it could not take one.
      if (this.#gate?.holds(tenant) === true) continue;
      const share = Math.max(1, Math.floor((window * weightOf(tenant)) / weights));
      const lately = peakAt > since ? peak : 0;
      const claim = Math.max(0, Math.min(Math.max(1, lately), share) - running);
      claims.set(tenant, claim);
      claimed += claim;
    }
    return (tenant) => !runs(tenant) || claimed - (claims.get(tenant) ?? 0) < free;
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

  /**
   * Calls let through and not started yet, forgetting those let through too long ago (refused
   * by a quota, answered from the store, or handed back by a failure: they never start).
   */
  #admitting(queue: ToolQueue): number {
    const since = this.#options.now() - ADMITTING_MS;
    while (queue.admitting.length > 0 && (queue.admitting[0] ?? 0) < since) queue.admitting.shift();
    return queue.admitting.length;
  }

  async #drain(tool: string, queue: ToolQueue): Promise<void> {
    const { depth, pollMs, log, now } = this.#options;
    let swept = now();
    while (queue.size > 0 && !this.#stopped) {
      if (now() - swept >= 100) {
        swept = now();
        await this.#expire(queue);
      }
      let read = false;
      try {
        // A call this process has not seen end holds its slot, even when the server has its
        // acknowledgement first: the slot is not handed on before its tenant counts it free.
        queue.depth = Math.max(await depth(tool), queue.running) + this.#admitting(queue);
        queue.depthAt = now();
        read = true;
      } catch (err) {
        log.warn({ err, tool }, "cannot read a tool's work depth; trying again");
      }
      // One round: the calls that fit, in turn, handed on together. Each is counted (in the
      // depth and as its tenant's) before it is published: a read of the depth meanwhile may not
      // include it.
      const round: HeldCall[] = [];
      const gate = this.#gate;
      while (read) {
        const mayStart = this.#mayStart(queue, queue.depth);
        const call = queue.next(
          (t) => this.#options.weightOf(t),
          (t) => queue.activity.get(t)?.running ?? 0,
          // The gate is asked at each pick: each call handed on counts at once.
          gate === undefined ? mayStart : (t) => !gate.holds(t) && mayStart(t),
        );
        if (call === undefined) break;
        this.#held.delete(call.id);
        // A held call was never let through by busy(): it leaves the let-through count alone.
        if (!this.#started.has(call.id)) this.#start(tool, queue, call);
        queue.depth++;
        round.push(call);
      }
      await Promise.all(
        round.map((call) =>
          call.dispatch().catch((err: unknown) => {
            log.error(
              { err, call: call.id, callId: call.callId },
              "cannot hand a held call on; it will be redelivered",
            );
            this.notStarted(call.id);
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
        this.#options.log.error(
          { err, call: call.id, callId: call.callId },
          "cannot answer a held call's deadline",
        );
        call.msg.nak(1_000);
      });
    }
  }
}
