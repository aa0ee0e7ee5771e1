import type { NatsConnection } from "@nats-io/nats-core";
import type { KV } from "@nats-io/kv";
import { Kvm } from "@nats-io/kv";
import type { PendingApproval, SessionAddress, Subjects } from "@toolmesh/protocol";
import { PendingApprovalSchema, callKey, decodeJson } from "@toolmesh/protocol";

/**
 * A call that waits for a person, as any reader sees it at rest: who it waits for, until when,
 * and the id an approver names it by (`toolmesh approvals approve ID`).
 */
export interface WaitingApproval {
  /** `waiting` for a decision, or `approved` and not yet routed (it runs next). */
  readonly state: "waiting" | "approved";
  readonly kind: PendingApproval["mode"];
  /** The call id an approver or the caller names. */
  readonly approvalId: string;
  readonly tool: string;
  /** The call's arguments as resolved (what a person is asked to let run). */
  readonly arguments: Record<string, unknown>;
  /** Epoch ms, by the NATS server's clock. */
  readonly requestedAt: number;
  readonly expiresAt: number;
}

/**
 * Read-only view of the calls waiting for approval (the approvals bucket the resolvers keep,
 * ADR 0059): any replica of a frontend sees a waiting call after a restart, whatever it was told.
 */
export class ApprovalsAtRest {
  readonly #kv: KV;

  private constructor(kv: KV) {
    this.#kv = kv;
  }

  /** Binds to the approvals bucket (the resolvers create it). */
  static async bind(nc: NatsConnection, subjects: Subjects): Promise<ApprovalsAtRest> {
    return new ApprovalsAtRest(await new Kvm(nc).open(subjects.callApprovalsBucket));
  }

  /**
   * The call's approval while it waits or is approved but not yet routed; undefined once it is
   * routed or ended (its call record answers then), or when there is none.
   */
  async waiting(
    address: SessionAddress,
    idempotencyKey: string,
  ): Promise<WaitingApproval | undefined> {
    const got = await this.#kv.get(callKey(address, idempotencyKey));
    if (got === null || got.operation !== "PUT") return undefined;
    const parsed = PendingApprovalSchema.safeParse(decodeJson(got.value));
    if (!parsed.success) return undefined;
    const entry = parsed.data;
    if (entry.state !== "waiting" && entry.state !== "approved") return undefined;
    return {
      state: entry.state,
      kind: entry.mode,
      approvalId: entry.call.call_id,
      tool: entry.call.tool,
      arguments: entry.call.arguments,
      requestedAt: entry.requested_at,
      expiresAt: entry.expires_at,
    };
  }
}
