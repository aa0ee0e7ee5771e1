import type { Msg, NatsConnection, Subscription } from "@nats-io/nats-core";
import type { JsMsg } from "@nats-io/jetstream";
import { z } from "zod";
import type { CancelReply, ResolvedCall, Subjects, ToolMessage } from "@toolmesh/protocol";
import {
  CallRequestSchema,
  CancelRequestSchema,
  ErrorCode,
  ResolvedCallSchema,
  SessionAddressSchema,
  ToolmeshError,
  callKey,
  decodeJson,
  encodeJson,
  ensureError,
  errorToolMessage,
  subjectToken,
  decodeJsonOrUndefined,
  idempotencyKeyOf,
} from "@toolmesh/protocol";
import type { WorkLoop } from "@toolmesh/nats";
import {
  Semaphore,
  ServerClock,
  deadLetterHeaders,
  ensureConsumer,
  DEADLINE_FIRST_HOP_MS,
  meshPlan,
  publishDurable,
  publishEphemeral,
  startWorkLoop,
} from "@toolmesh/nats";
import type { CallPlane } from "@toolmesh/call-store";
import { ANY_ARGUMENTS } from "@toolmesh/call-store";
import type { Logger } from "@toolmesh/telemetry";
import { toolmeshMetrics } from "@toolmesh/telemetry";
import { reconcileOrphans } from "./reconcile.js";

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

/** What the server says when a consumer gives up on a message. */
const MaxDeliveriesAdvisorySchema = z.object({
  stream: z.string(),
  consumer: z.string(),
  stream_seq: z.number(),
  deliveries: z.number(),
});

/** Options of {@link startControlPlane}. */
export interface ControlPlaneOptions {
  nc: NatsConnection;
  plane: CallPlane;
  subjects: Subjects;
  log: Logger;
  /** How often orphaned work-queue messages are looked for, in ms. Default 30 000. */
  reconcileEveryMs?: number;
}

/** The parts of the resolver that keep the guarantees once a call is accepted. */
export interface ControlPlane {
  /** Arms the deadline of an accepted call: it ends with `deadline_exceeded` if still open then. */
  armDeadline(call: ResolvedCall, workSeq: number): Promise<void>;
  /** Moves a stream message to the dead-letter stream and ends its call with an error. */
  deadLetter(stream: string, seq: number, reason: string, deliveries?: number): Promise<void>;
  stop(graceMs: number): Promise<void>;
}

const QUEUE = "toolmesh-resolver";
// JetStream redelivery delays are bounded; long deadlines are waited for in hops.
const MAX_TIMER_HOP_MS = 3_600_000;
// Long enough for the dead-letter keeper to take a call its consumer gave up on.
const SECOND_LOOK_MS = 5_000;

/**
 * Starts the deadline keeper (a durable consumer of the timers stream that naks each timer
 * until its deadline), the dead-letter keeper (driven by the server's max-deliveries
 * advisories), cancellation requests, and the periodic reconciliation of orphaned messages.
 */
export async function startControlPlane(options: ControlPlaneOptions): Promise<ControlPlane> {
  const { nc, plane, subjects, log } = options;
  const { js, jsm, store, clock } = plane;
  const { consumers } = meshPlan(subjects);
  await ensureConsumer(jsm, consumers.deadlines);
  // Advisories are kept in a stream, so a give-up while no resolver runs is handled later.
  await ensureConsumer(jsm, consumers.deadLetters);

  const timers: WorkLoop = await startWorkLoop({
    js,
    stream: subjects.streams.timers,
    consumer: subjects.deadlineConsumer,
    slots: new Semaphore(64),
    maxMessages: 64,
    handle: handleTimer,
    onError: (err) => log.error({ err }, "deadline keeper error"),
  });

  const subscriptions: Subscription[] = [
    nc.subscribe(subjects.allCancel, {
      queue: QUEUE,
      callback: (err, msg) => {
        if (err === null) void answerCancel(msg);
      },
    }),
  ];

  const deadLetters: WorkLoop = await startWorkLoop({
    js,
    stream: subjects.streams.advisories,
    consumer: subjects.deadLetterConsumer,
    slots: new Semaphore(8),
    maxMessages: 8,
    handle: onMaxDeliveries,
    onError: (err) => log.error({ err }, "dead-letter keeper error"),
  });

  let stopped = false;
  // Calls found below their ack floor are acted on by a second pass, soon after the first.
  const suspects = new Set<string>();
  const reconcile = (sweepTimers = false): void => {
    reconcileOrphans({ js, jsm, subjects, store, log, suspects, sweepTimers }).then(
      (outcome) => {
        if (outcome.deleted + outcome.republished > 0)
          log.info(outcome, "orphaned messages reconciled");
        if (suspects.size > 0 && !stopped) setTimeout(() => reconcile(), SECOND_LOOK_MS).unref();
      },
      (err: unknown) =>
        log.warn({ err }, "reconciliation of orphaned messages failed; will try again"),
    );
  };
  // Orphans and lost acknowledgements come with a server restart: look as soon as it is back
  // (or this resolver starts, maybe after one), and now and then.
  reconcile(true);
  const reconcileTimer = setInterval(() => reconcile(), options.reconcileEveryMs ?? 30_000);
  reconcileTimer.unref();
  void (async () => {
    for await (const status of nc.status()) {
      if (status.type === "reconnect") setTimeout(() => reconcile(true), 1_000).unref();
    }
  })();

  async function handleTimer(msg: JsMsg): Promise<void> {
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

  /**
   * Ends an accepted call of the session with `cancelled`; the key names a call of this
   * session only (records are keyed by session). When no call has the key yet, a cancelled
   * record is left for it: a call that arrives with the key later is answered from it and never
   * runs (`pending`).
   */
  async function cancelCall(
    callId: string,
    sessionId: string,
    key: string,
    address: { tenant: string; session: string },
  ): Promise<CancelReply> {
    const call = { idempotency_key: key, address };
    const cancelled = (id: string, session: string, tool: string): ToolMessage =>
      errorToolMessage(
        { tool_call_id: id, name: tool, session_id: session },
        new ToolmeshError(ErrorCode.Cancelled, `call ${id} was cancelled by its caller`),
      );
    for (;;) {
      const current = await store.get(call);
      if (current !== undefined) {
        // The final message answers the call that owns the key, whatever id the cancel named.
        const { record } = current;
        const won = await plane.finalize(
          record,
          cancelled(record.call_id, record.session_id, record.tool),
          current,
        );
        if (won)
          publishEphemeral(nc, subjects.abort, {
            call_key: callKey(address, key),
            reason: "cancelled",
          });
        return { cancelled: won, state: won ? "cancelled" : "done", idempotency_key: key };
      }
      const early = await store.accept({
        idempotency_key: key,
        call_id: callId,
        session_id: sessionId,
        address,
        tool: "",
        args_hash: ANY_ARGUMENTS,
        state: "done",
        deadline_at: clock.now(),
        result: cancelled(callId, sessionId, ""),
      });
      if (early.status === "new")
        return { cancelled: false, state: "pending", idempotency_key: key };
      // The resolver accepted the call meanwhile: cancel it as an accepted call.
    }
  }

  async function answerCancel(msg: Msg): Promise<void> {
    let reply: CancelReply;
    try {
      const address = subjects.parseSessionSubject(msg.subject);
      if (address === undefined) {
        throw new ToolmeshError(
          ErrorCode.InvalidRequest,
          `cancel subject "${msg.subject}" holds a token no session id maps to`,
          { details: { subject: msg.subject } },
        );
      }
      const request = CancelRequestSchema.parse(decodeJson(msg.data));
      if (subjectToken(request.session_id) !== address.session) {
        throw new ToolmeshError(
          ErrorCode.InvalidRequest,
          "session_id does not match the session of the subject",
          { details: { session_id: request.session_id } },
        );
      }
      const key = idempotencyKeyOf(request, request.tool_call_id);
      reply = await cancelCall(request.tool_call_id, request.session_id, key, address);
    } catch (err) {
      const error = ensureError(
        err instanceof z.ZodError
          ? new ToolmeshError(ErrorCode.InvalidRequest, `malformed cancel request: ${err.message}`)
          : err,
      );
      reply = { cancelled: false, state: "unknown", error: error.toWire() };
    }
    msg.respond(encodeJson(reply));
  }

  async function onMaxDeliveries(msg: JsMsg): Promise<void> {
    const advisory = MaxDeliveriesAdvisorySchema.safeParse(decodeJsonOrUndefined(msg.data));
    if (!advisory.success) {
      msg.ack();
      return;
    }
    const { stream, stream_seq: seq, deliveries } = advisory.data;
    try {
      await deadLetter(stream, seq, "max_deliveries", deliveries);
      msg.ack();
    } catch (err) {
      log.error({ err, stream, seq }, "cannot dead-letter a message yet; will try again");
      msg.nak(5_000);
    }
  }

  async function deadLetter(
    stream: string,
    seq: number,
    reason: string,
    deliveries = 0,
  ): Promise<void> {
    const stored = await jsm.streams.getMessage(stream, { seq }).catch(() => null);
    if (stored === null) return; // already handled by another resolver
    const body = decodeJsonOrUndefined(stored.data);
    const work = stream === subjects.streams.work ? ResolvedCallSchema.safeParse(body) : undefined;
    const request =
      stream === subjects.streams.calls ? CallRequestSchema.safeParse(body) : undefined;
    const tool = work?.data?.tool ?? request?.data?.tool_call.function.name ?? "_unknown";
    const h = deadLetterHeaders({
      stream,
      subject: stored.subject,
      seq,
      reason,
      deliveries,
      headers: stored.header,
    });
    await js.publish(subjects.dlq(tool), stored.data, {
      headers: h,
      msgID: `dlq:${stream}:${seq}`,
    });
    toolmeshMetrics().deadLettered(stream);

    const error = new ToolmeshError(
      ErrorCode.ToolError,
      reason === "max_deliveries"
        ? `gave up after ${deliveries} deliveries: the call failed its worker every time`
        : `call could not be processed: ${reason}`,
      { retryable: false, details: { reason, deliveries, dead_letter: true } },
    );
    if (work?.success === true) {
      const call = work.data;
      await plane.finalize(
        call,
        errorToolMessage(
          { tool_call_id: call.call_id, name: call.tool, session_id: call.session_id },
          error,
          { attempts: deliveries },
        ),
      );
    } else {
      const address = subjects.parseSessionSubject(stored.subject);
      const callId = request?.data?.tool_call.id ?? `invalid-${seq}`;
      if (address !== undefined) {
        const sessionId = request?.data?.session_id ?? address.session;
        const message: ToolMessage = errorToolMessage(
          { tool_call_id: callId, name: tool, session_id: sessionId },
          error,
          {
            attempts: deliveries,
          },
        );
        await publishDurable(js, subjects.result(address, callId), message, {
          msgId: `result:${callKey(address, request?.data?.idempotency_key ?? `${sessionId}/${callId}`)}`,
        });
      }
    }
    await jsm.streams.deleteMessage(stream, seq).catch(() => false);
    log.warn({ stream, seq, tool, reason, deliveries }, "message moved to the dead-letter stream");
  }

  return {
    async armDeadline(call, workSeq) {
      await publishDurable(
        js,
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
    },
    deadLetter,
    async stop(graceMs) {
      stopped = true;
      clearInterval(reconcileTimer);
      for (const sub of subscriptions) sub.unsubscribe();
      await Promise.all([timers.stop(graceMs), deadLetters.stop(graceMs)]);
    },
  };
}
