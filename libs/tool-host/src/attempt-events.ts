import type { ResolvedCall } from "@toolmesh/protocol";
import type { AuditTrail } from "@toolmesh/audit";
import { AuditEventType } from "@toolmesh/audit";

/**
 * How long an attempt runs before its start is recorded on its own. An attempt that ends its
 * call sooner is recorded by the call's end (ADR 0067).
 */
export const ATTEMPT_SHOWN_AFTER_MS = 1_000;

/** What `attempt.ended` records. */
interface Ended {
  attempt: number;
  duration_ms: number;
  outcome: string;
}

/**
 * The audit events of one attempt (ADR 0060, ADR 0067). Its start is recorded once it has run
 * {@link ATTEMPT_SHOWN_AFTER_MS}, and its end then as soon as it ends. An attempt that ends
 * sooner is held: when it ends the call, the call's end records it (its process in `by`, its
 * number in `attempts`, its duration and outcome), and nothing more is written; otherwise
 * (retried, handed back, the call ended by another party, its outcome not recorded) its start
 * and end are recorded when it is settled.
 */
export class AttemptEvents {
  readonly #audit: Pick<AuditTrail, "record">;
  readonly #call: ResolvedCall;
  readonly #attempt: number;
  readonly #startedAt = Date.now();
  #timer: NodeJS.Timeout | undefined;
  /**
   * `held`: nothing written yet; `shown`: its start is written (its end follows when it ends);
   * `folded`: the call's end records it, nothing of its own is written.
   */
  #state: "held" | "shown" | "folded" = "held";
  #ended: Ended | undefined;
  #endedAt = 0;

  constructor(audit: Pick<AuditTrail, "record">, call: ResolvedCall, attempt: number) {
    this.#audit = audit;
    this.#call = call;
    this.#attempt = attempt;
    this.#timer = setTimeout(() => this.#recordStart(), ATTEMPT_SHOWN_AFTER_MS).unref();
  }

  /** The attempt is over: its end is recorded now if its start was, else held. */
  ended(ended: Ended): void {
    this.#stopTimer();
    if (this.#state === "shown") this.#record(AuditEventType.AttemptEnded, Date.now(), ended);
    else if (this.#state === "held") {
      this.#ended = ended;
      this.#endedAt = Date.now();
    }
  }

  /** The attempt's final message ended the call: that end's event records a held attempt. */
  endedTheCall(): void {
    this.#stopTimer();
    this.#ended = undefined;
    if (this.#state === "held") this.#state = "folded";
  }

  /** The delivery is settled: what is still held is recorded. */
  settle(): void {
    this.#stopTimer();
    this.#recordStart();
    if (this.#ended !== undefined) {
      this.#record(AuditEventType.AttemptEnded, this.#endedAt, this.#ended);
      this.#ended = undefined;
    }
  }

  #recordStart(): void {
    if (this.#state !== "held") return;
    this.#state = "shown";
    this.#record(AuditEventType.AttemptStarted, this.#startedAt, { attempt: this.#attempt });
  }

  #stopTimer(): void {
    clearTimeout(this.#timer);
    this.#timer = undefined;
  }

  #record(type: AuditEventType, at: number, data: object): void {
    const call = this.#call;
    void this.#audit.record(call.address.tenant, {
      type,
      call_id: call.call_id,
      session: call.session_id,
      tool: call.tool,
      at,
      data: { ...data },
    });
  }
}
