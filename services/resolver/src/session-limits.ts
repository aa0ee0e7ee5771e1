import type { ResolvedCall, SessionAddress } from "@toolmesh/protocol";
import { subjectToken } from "@toolmesh/protocol";

/**
 * Counts the calls of each session that this resolver routed and whose final message has not
 * been seen yet, and refuses more than `max` of them. Entries past their deadline no longer
 * count, so a final message this process missed cannot block a session for good.
 */
export class SessionLimits {
  readonly max: number;
  // `{tenant}.{session}` tokens → (call token → deadline_at)
  readonly #inFlight = new Map<string, Map<string, number>>();

  /** @param max calls in flight per session (at least 1) */
  constructor(max: number) {
    this.max = Math.max(1, max);
  }

  /** Counts the call in, unless its session is full. A call already counted passes. */
  tryAcquire(call: ResolvedCall, now: number = Date.now()): boolean {
    const calls = this.#calls(call.address);
    const key = subjectToken(call.call_id);
    if (calls.has(key)) return true;
    if (calls.size >= this.max) {
      for (const [k, deadline] of calls) if (deadline < now) calls.delete(k);
      if (calls.size >= this.max) return false;
    }
    calls.set(key, call.deadline_at);
    return true;
  }

  /** Counts the call out. */
  release(call: ResolvedCall): void {
    this.settled(call.address, subjectToken(call.call_id));
  }

  /** Counts out the call a final message was published for (its session and call token). */
  settled(at: SessionAddress, callToken: string): void {
    const session = `${at.tenant}.${at.session}`;
    const calls = this.#inFlight.get(session);
    if (calls === undefined) return;
    calls.delete(callToken);
    if (calls.size === 0) this.#inFlight.delete(session);
  }

  #calls(at: SessionAddress): Map<string, number> {
    const session = `${at.tenant}.${at.session}`;
    let calls = this.#inFlight.get(session);
    if (calls === undefined) {
      calls = new Map();
      this.#inFlight.set(session, calls);
    }
    return calls;
  }
}
