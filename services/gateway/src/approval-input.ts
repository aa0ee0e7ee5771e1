import type { InputRequests } from "@modelcontextprotocol/server";
import { inputRequired, inputResponse } from "@modelcontextprotocol/server";
import type { WaitingApproval } from "@toolmesh/call-store";
import type { ApprovalReply } from "@toolmesh/protocol";
import { ErrorCode, ToolmeshError } from "@toolmesh/protocol";
import type { CallAtRest, InputRequestSource, Resumption } from "./input-required.js";
import { refused } from "./input-required.js";

/** The key of the one form this source asks. */
const FORM = "confirm";

/** What the source needs of the mesh. */
export interface ApprovalDesk {
  /** The approval the call waits for, read at rest (the approvals bucket). */
  waiting(tenant: string, callId: string): Promise<WaitingApproval | undefined>;
  /** The caller's confirmation (true) or refusal of the call. */
  confirm(tenant: string, callId: string, confirm: boolean): Promise<ApprovalReply>;
}

/**
 * A call that waits for its caller's confirmation (`@approval("caller")`, ADR 0059): asks the
 * caller, in a form with no fields, to accept (the call runs once) or decline (it ends with
 * `approval_denied`), and gives the answer to the mesh as the caller's confirm. The call goes on
 * under its id: the retry joins it and is answered with its result.
 */
export class ApprovalInput implements InputRequestSource {
  readonly kind = "a";
  readonly mode = "form";

  constructor(private readonly desk: ApprovalDesk) {}

  ask(call: CallAtRest): InputRequests | undefined {
    const waiting = call.waiting;
    if (waiting?.kind !== "caller" || waiting.state !== "waiting") return undefined;
    return {
      [FORM]: inputRequired.elicit({
        message: `Run ${call.tool} with ${JSON.stringify(call.arguments)}? Accept to run it once, decline to refuse it (until ${new Date(waiting.expiresAt).toISOString()}).`,
        requestedSchema: { type: "object", properties: {} },
      }),
    };
  }

  async waiting(tenant: string, callId: string): Promise<boolean> {
    const waiting = await this.desk.waiting(tenant, callId);
    return waiting?.kind === "caller" && waiting.state === "waiting";
  }

  async answer(call: CallAtRest, responses: Record<string, unknown>): Promise<Resumption> {
    const view = inputResponse(responses, FORM);
    if (view.kind !== "elicit")
      return refused(
        ErrorCode.InvalidRequest,
        `inputResponses has no answer to "${FORM}": accept or decline the call the input_required result asked about`,
      );
    // Cancel (dismissed without a choice) leaves the call waiting for an answer.
    if (view.action === "cancel")
      return refused(
        ErrorCode.Cancelled,
        "the caller dismissed the confirmation: the call still waits; accept or decline it",
      );
    const reply = await this.desk.confirm(call.tenant, call.callId, view.action === "accept");
    if (!reply.ok)
      return {
        kind: "refused",
        error:
          reply.error === undefined
            ? new ToolmeshError(ErrorCode.Internal, "the mesh refused the confirmation")
            : ToolmeshError.fromWire(reply.error),
      };
    return { kind: "resumed" };
  }
}
