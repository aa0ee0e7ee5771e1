import type { JsMsg } from "@nats-io/jetstream";
import { z } from "zod";
import type { ResolvedCall } from "@toolmesh/protocol";
import {
  ErrorCode,
  SessionAddressSchema,
  ToolmeshError,
  callKey,
  decodeJsonOrUndefined,
  errorToolMessage,
} from "@toolmesh/protocol";
import {
  DEADLINE_FIRST_HOP_MS,
  ServerClock,
  publishDurable,
  publishEphemeral,
} from "@toolmesh/nats";
import type { ControlDeps } from "./deps.js";

/** A deadline armed for an accepted call, kept on the timers stream. */
const DeadlineTimerSchema = z.object({
  idempotency_key: z.string(),
  call_id: z.string(),
  tool: z.string(),
  session_id: z.string(),
  address: SessionAddressSchema,
  deadline_at: z.number(),
  timeout_ms: z.number(),
  /** Sequence of the call's work message, removed from the work stream at the deadline. */
  work_seq: z.number(),
});

// JetStream redelivery delays are bounded; long deadlines are waited for in hops.
const MAX_TIMER_HOP_MS = 3_600_000;

/** Arms the deadline of an accepted call: it ends with `deadline_exceeded` if still open then. */
export async function armDeadline(
  deps: ControlDeps,
  call: ResolvedCall,
  workSeq: number,
): Promise<void> {
  const { plane, subjects } = deps;
  await publishDurable(
    plane.js,
    subjects.deadlineTimer,
    {
      idempotency_key: call.idempotency_key,
      call_id: call.call_id,
      tool: call.tool,
      session_id: call.session_id,
      address: call.address,
      deadline_at: call.deadline_at,
      timeout_ms: call.timeout_ms,
      work_seq: workSeq,
    } satisfies z.infer<typeof DeadlineTimerSchema>,
    { msgId: `deadline:${callKey(call.address, call.idempotency_key)}` },
  );
}

/**
 * One delivery of a deadline timer (durable consumer `deadline_keeper`): held until the deadline
 * by naks, then the call ends with `deadline_exceeded` if it is still open.
 */
export async function handleTimer(deps: ControlDeps, msg: JsMsg): Promise<void> {
  const { nc, plane, subjects, log } = deps;
  const { jsm, store, clock } = plane;
  clock.observe(ServerClock.timestampOf(msg));
  const parsed = DeadlineTimerSchema.safeParse(decodeJsonOrUndefined(msg.data));
  if (!parsed.success) {
    log.error({ seq: msg.seq }, "deadline timer is not valid; dropped");
    msg.term();
    return;
  }
  const timer = parsed.data;
  const remaining = timer.deadline_at - clock.now();
  if (remaining > 0) {
    // Most calls end within moments: after a first short hop a timer whose call ended is
    // dropped, so the timers held by the server stay few however long the deadlines.
    if (msg.info.deliveryCount > 1) {
      const current = await store.get(timer).catch(() => undefined);
      if (current?.record.state === "done") {
        msg.ack();
        return;
      }
    } else if (remaining > DEADLINE_FIRST_HOP_MS) {
      // Left unacknowledged: the server delivers it again after the ack wait, the first hop,
      // without a message from here.
      return;
    }
    // Held by the server for the hop, then delivered again.
    const hop = msg.info.deliveryCount === 1 ? DEADLINE_FIRST_HOP_MS : MAX_TIMER_HOP_MS;
    msg.nak(Math.min(remaining, hop, MAX_TIMER_HOP_MS));
    return;
  }
  const message = errorToolMessage(
    { tool_call_id: timer.call_id, name: timer.tool, session_id: timer.session_id },
    new ToolmeshError(
      ErrorCode.DeadlineExceeded,
      `call ${timer.call_id} did not finish within ${timer.timeout_ms} ms`,
      {
        details: { deadline_at: timer.deadline_at, timeout_ms: timer.timeout_ms },
      },
    ),
  );
  try {
    // Work still queued (no executor running) must not outlive its call; removed first so
    // the call's end is the last thing anyone sees. A call that already ended has no
    // work left to remove.
    await jsm.streams.deleteMessage(subjects.streams.work, timer.work_seq).catch(() => false);
    const won = await plane.finalize(timer, message);
    if (won) {
      publishEphemeral(nc, subjects.abort, {
        call_key: callKey(timer.address, timer.idempotency_key),
        reason: "deadline_exceeded",
      });
      log.info(
        { callId: timer.call_id, tool: timer.tool, sessionId: timer.session_id },
        "call passed its deadline",
      );
    }
    msg.ack();
  } catch (err) {
    log.warn({ err, callId: timer.call_id }, "cannot end the call at its deadline yet; retrying");
    msg.nak(500);
  }
}
