import type { JsMsg } from "@nats-io/jetstream";
import type { CallRequest, ResolvedCall, SessionAddress } from "@toolmesh/protocol";
import {
  ErrorCode,
  ToolmeshError,
  overloadedMsgId,
  refusedMsgId,
  subjectToken,
} from "@toolmesh/protocol";
import type { ToolmeshMetrics } from "@toolmesh/telemetry";
import type { SessionLimits } from "./session-limits.js";
import type { QuotaGate } from "./quotas.js";
import type { FairShare, HeldCall } from "./fair-share.js";
import type { StoredBytes } from "./stored-bytes.js";
import type { BytesInFlight } from "./bytes-in-flight.js";
import type { ToolCapacity } from "@toolmesh/registry";

// Admission decides whether a resolved call may go to its tool's work now, must wait for its
// turn, or is refused; what it takes for the call (a session slot, quota counts, a fair-share
// turn) is given back through the ticket it hands out, or when the call's final message goes by.
//
// The steps, in order (each a method below; `admit` runs them and gives back what the earlier
// ones took when a later one refuses):
//   0. stored results — `StoredBytes`: a tenant at its bound of stored results is refused
//                       (`quota_exceeded`, quota `storage`; takes nothing, so it goes first);
//   1. session slot   — `SessionLimits`: at most `max` calls of a session in flight here
//                       (refusal: `overloaded`, labelled `session_max_in_flight`);
//   2. fair turn      — `FairShare.busy`: a busy tool's call is held for its tenant's turn,
//                       and a tenant at its bound of bytes in flight (`BytesInFlight`, the fair
//                       share's gate) waits for its bytes to come down (never refuses; decides
//                       "hold" or "go", which step 3 counts as queued);
//   3. quotas         — `QuotaGate.admit`: the tenant's, tool's and agent's limits
//                       (refusal: the quota's error, labelled with the quota's name).
// A new decision is one more step: a method returning a refusal or what it took (a `Taken`),
// called from `admit` where it belongs in that order (a decision that takes nothing and refuses
// on its own goes first, before anything is counted).

/** A resolved call as admission sees it. */
export interface AdmissionCall {
  resolved: ResolvedCall;
  request: CallRequest;
  /** Its call key (`callKey(address, idempotency_key)`): what quotas count it by. */
  key: string;
  /** Its message's sequence in the calls stream: a refusal's message id names the delivery. */
  seq: number;
  /** Its message's size in bytes (its arguments): what it weighs in flight, with its result. */
  messageBytes?: number;
}

/** What admission decided for one call. */
export type AdmissionVerdict =
  | {
      decision: "refuse";
      error: ToolmeshError;
      /** The message id of the refusal's final message. */
      msgId: string;
      /** Whether the refusal is worth a log line of its own (a quota's). */
      logged: boolean;
    }
  | { decision: "go" | "hold"; ticket: AdmissionTicket };

/** What a step took for a call, and how to give it back when the call is not routed after all. */
interface Taken {
  giveBack(): Promise<void> | void;
}

/** Options of {@link Admission}. */
export interface AdmissionOptions {
  limits: SessionLimits;
  /** The quotas of tenants, tenants' tools and agents; none are checked when undefined. */
  quotas?: QuotaGate | undefined;
  /** What each tenant's calls have stored, against its bound; none is checked when undefined. */
  stored?: StoredBytes | undefined;
  /** Holds calls to busy tools for a fair turn among tenants; calls go straight on when undefined. */
  fairShare?: FairShare | undefined;
  /** What executors announce they can run, per tool: fair share's window (ADR 0055). */
  capacity?: ToolCapacity | undefined;
  /** Weighs calls for the bytes-in-flight gate, which `fairShare` was given; none when undefined. */
  bytesInFlight?: BytesInFlight | undefined;
  metrics: ToolmeshMetrics;
}

/**
 * The id a call is admitted under: its session address and call token, as the subject of its
 * final message names them. Quotas and fair share count a call by it until that message.
 */
export function admissionId(at: SessionAddress, callToken: string): string {
  return `${at.tenant}.${at.session}.${callToken}`;
}

function idOf(call: AdmissionCall): string {
  const { address, call_id } = call.resolved;
  return admissionId(address, subjectToken(call_id));
}

/** Admits resolved calls (session slot, fair turn, quotas) and settles them on their final message. */
export class Admission {
  readonly limits: SessionLimits;
  readonly quotas: QuotaGate | undefined;
  readonly stored: StoredBytes | undefined;
  readonly fairShare: FairShare | undefined;
  readonly bytesInFlight: BytesInFlight | undefined;
  readonly #capacity: ToolCapacity | undefined;
  readonly #metrics: ToolmeshMetrics;

  constructor(options: AdmissionOptions) {
    this.limits = options.limits;
    this.quotas = options.quotas;
    this.stored = options.stored;
    this.#capacity = options.capacity;
    this.fairShare = options.fairShare;
    this.bytesInFlight = options.bytesInFlight;
    this.#metrics = options.metrics;
  }

  /** Runs the steps in order; a refusal gives back what the steps before it took. */
  async admit(call: AdmissionCall, now: number): Promise<AdmissionVerdict> {
    const taken: Taken[] = [];
    const full = this.stored?.refusal(call.resolved.address.tenant);
    if (full !== undefined) return this.#refuse(call, full, taken, "storage");
    const slot = this.#sessionSlot(call, now);
    if (slot instanceof ToolmeshError)
      return this.#refuse(call, slot, taken, "session_max_in_flight", "overloaded");
    taken.push(slot);
    const held = await this.#fairTurn(call);
    if (!held) taken.push(this.#bytesTaken(call));
    const counted = await this.#quotas(call, held);
    if (counted instanceof ToolmeshError) {
      const quota = counted.details?.quota;
      return this.#refuse(call, counted, taken, typeof quota === "string" ? quota : "unknown");
    }
    taken.push(counted);
    const ticket = new AdmissionTicket(this, call, taken);
    return { decision: held ? "hold" : "go", ticket };
  }

  /**
   * Settles the call a final message was published for (its session address and call token,
   * from the result subject), whichever process admitted it: its session slot and quota counts
   * here are given back, and fair share is told (`toolOf` reads the tool from the message, asked
   * only while calls are held and only for a call another resolver started: which tool may have
   * a free executor now; `resultBytes`, the message's size, teaches the bytes-in-flight gate).
   * Never throws.
   */
  settle(
    at: SessionAddress,
    callToken: string,
    toolOf: () => string | undefined,
    resultBytes?: number,
  ): void {
    this.limits.settled(at, callToken);
    this.quotas?.ended(at.tenant, at.session, callToken);
    const { fairShare } = this;
    if (fairShare !== undefined) fairShare.ended(admissionId(at, callToken), toolOf, resultBytes);
  }

  /** The bytes a call is expected to move, for the bytes-in-flight gate (0 without one). */
  weigh(call: AdmissionCall): number {
    const { resolved } = call;
    return (
      this.bytesInFlight?.weigh(resolved.address.tenant, resolved.tool, call.messageBytes ?? 0) ?? 0
    );
  }

  /** Stops holding calls and following executors' capacity. */
  stop(): void {
    this.fairShare?.stop();
    this.#capacity?.stop();
  }

  /**
   * Forgets the session slots and fair-share counts after a reconnect: final messages published
   * while this process was disconnected were never seen.
   */
  reconnected(): void {
    this.limits.clear();
    this.fairShare?.reconnected();
  }

  /** Step 1: a slot among its session's calls in flight through this process. */
  #sessionSlot(call: AdmissionCall, now: number): Taken | ToolmeshError {
    const { resolved } = call;
    if (this.limits.tryAcquire(resolved, now))
      return { giveBack: () => this.limits.release(resolved) };
    return new ToolmeshError(
      ErrorCode.Overloaded,
      `session ${resolved.session_id} has too many calls in flight`,
      { details: { max_in_flight: this.limits.max, retry_after_ms: 1_000 } },
    );
  }

  /**
   * Step 2: whether the call's tool is busy or its tenant at its bound of bytes in flight, so
   * that the call waits for its tenant's turn; a call let through counts in its bytes at once.
   */
  async #fairTurn(call: AdmissionCall): Promise<boolean> {
    const { fairShare } = this;
    const { resolved } = call;
    if (fairShare === undefined) return false;
    const counted =
      this.bytesInFlight === undefined
        ? undefined
        : { id: idOf(call), bytes: this.weigh(call), deadlineAt: resolved.deadline_at };
    return await fairShare.busy(resolved.tool, resolved.address.tenant, counted);
  }

  /** What step 2 counted in a call's bytes in flight, given back if it is not routed. */
  #bytesTaken(call: AdmissionCall): Taken {
    const bytes = this.bytesInFlight;
    return { giveBack: () => bytes?.ended(idOf(call)) };
  }

  /**
   * Step 3: counts the call into the quotas of its tenant, tool and agent (as queued when it is
   * held), or says which refused it. Free for tenants without a quota (one map lookup).
   */
  async #quotas(call: AdmissionCall, queued: boolean): Promise<Taken | ToolmeshError> {
    const scopes = this.#scopesOf(call);
    const { quotas } = this;
    if (quotas === undefined || scopes.length === 0) return { giveBack: () => undefined };
    const { resolved, key } = call;
    const refusal = await quotas.admit(
      { key, deadline_at: resolved.deadline_at },
      { ...resolved.address, callToken: subjectToken(resolved.call_id) },
      scopes,
      queued,
    );
    if (refusal !== undefined) return refusal;
    return {
      giveBack: async () => {
        const { address } = resolved;
        quotas.ended(address.tenant, address.session, subjectToken(resolved.call_id));
        await quotas.release(key, scopes);
      },
    };
  }

  /** Marks a held call's quota counts as no longer queued: its turn came. */
  async dequeued(call: AdmissionCall): Promise<void> {
    const scopes = this.#scopesOf(call);
    if (this.quotas !== undefined && scopes.length > 0)
      await this.quotas.dequeued({ key: call.key, deadline_at: call.resolved.deadline_at }, scopes);
  }

  #scopesOf(call: AdmissionCall): string[] {
    const { resolved, request } = call;
    return this.quotas?.view.scopesOf(resolved.address.tenant, resolved.tool, request.agent) ?? [];
  }

  async #refuse(
    call: AdmissionCall,
    error: ToolmeshError,
    taken: Taken[],
    reason: string,
    msgIdKind: "overloaded" | "refused" = "refused",
  ): Promise<AdmissionVerdict> {
    for (const step of taken.reverse()) await step.giveBack();
    const { tenant } = call.resolved.address;
    // Only tenants with a quota are labelled, which keeps the label's values bounded; a quota's
    // refusal is always of one.
    const labelled = msgIdKind === "refused" || this.#scopesOf(call).length > 0;
    this.#metrics.tenantRefused(labelled ? tenant : undefined, error.code, reason);
    return {
      decision: "refuse",
      error,
      msgId: (msgIdKind === "overloaded" ? overloadedMsgId : refusedMsgId)(call.key, call.seq),
      logged: msgIdKind === "refused",
    };
  }
}

/**
 * What an admitted call holds until its final message: the only way to give back what admission
 * took for it before then ({@link withdraw}), to start it ({@link publish}) or to hold it for
 * its fair turn ({@link hold}).
 */
export class AdmissionTicket {
  readonly #admission: Admission;
  readonly #call: AdmissionCall;
  readonly #taken: Taken[];

  /** @internal made by {@link Admission.admit} only */
  constructor(admission: Admission, call: AdmissionCall, taken: Taken[]) {
    this.#admission = admission;
    this.#call = call;
    this.#taken = taken;
  }

  /** The id the call is counted under until its final message. */
  get id(): string {
    return idOf(this.#call);
  }

  /** Gives back what admission took: the call is answered without being routed (a known key). */
  async withdraw(): Promise<void> {
    for (const step of [...this.#taken].reverse()) await step.giveBack();
  }

  /**
   * Publishes the call's work with `publishWork`, counted by fair share as running from now
   * until its final message; a publish that throws is not counted (the call comes back).
   */
  async publish(publishWork: () => Promise<void>): Promise<void> {
    const { fairShare } = this.#admission;
    if (fairShare === undefined) {
      await publishWork();
      return;
    }
    const { resolved } = this.#call;
    const started = {
      id: this.id,
      tenant: resolved.address.tenant,
      deadlineAt: resolved.deadline_at,
      bytes: this.#admission.weigh(this.#call),
    };
    fairShare.started(resolved.tool, started);
    try {
      await publishWork();
    } catch (err) {
      fairShare.notStarted(started.id);
      throw err;
    }
  }

  /**
   * Holds the call (its message, unacknowledged) for its fair turn: `dispatch` runs when the turn
   * comes, after its quota counts are marked as no longer queued; `expire` when its deadline
   * passes first.
   */
  hold(msg: JsMsg, dispatch: () => Promise<void>, expire: HeldCall["expire"]): void {
    const { fairShare } = this.#admission;
    if (fairShare === undefined) throw new Error("only a fair-share turn holds a call");
    const { resolved } = this.#call;
    fairShare.hold(resolved.tool, {
      id: this.id,
      callId: resolved.call_id,
      tenant: resolved.address.tenant,
      msg,
      deadlineAt: resolved.deadline_at,
      bytes: this.#admission.weigh(this.#call),
      dispatch: async () => {
        await this.#admission.dequeued(this.#call);
        await dispatch();
      },
      expire,
    });
  }
}
