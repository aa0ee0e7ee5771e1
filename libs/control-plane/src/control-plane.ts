import type { Msg } from "@nats-io/nats-core";
import { headers as createHeaders } from "@nats-io/nats-core";
import type { JsMsg, StoredMsg } from "@nats-io/jetstream";
import { z } from "zod";
import type { AbortMessage, CancelReply, ToolMessage } from "@toolmesh/protocol";
import {
  CallRequestSchema,
  CancelRequestSchema,
  Defaults,
  ErrorCode,
  Header,
  ResolvedCallSchema,
  ToolmeshError,
  callKey,
  errorToolMessage,
  parseRequest,
  resultMsgId,
  subjectToken,
  decodeJsonOrUndefined,
  idempotencyKeyOf,
  deadLetterMsgId,
  requeueMsgId,
} from "@toolmesh/protocol";
import type { RequestServer, RequestKind, WorkLoop } from "@toolmesh/nats";
import {
  Semaphore,
  answerRequest,
  deadLetterHeaders,
  ensureConsumer,
  finalHeaders,
  followStatus,
  meshPlan,
  publishDurable,
  publishEphemeral,
  serveRequests,
  startWorkLoop,
  warnUnavailable,
} from "@toolmesh/nats";
import { ANY_ARGUMENTS } from "@toolmesh/call-store";
import { toolmeshMetrics } from "@toolmesh/telemetry";
import type { ControlDeps } from "./deps.js";
import type { DeadlineKeeper } from "./deadline-keeper.js";
import { startDeadlineKeeper } from "./deadline-keeper.js";
import type { FinalSeen } from "./deadline-keeper.js";
import { reconcileOrphans } from "./reconcile.js";

/** What the server says when a consumer gives up on a message. */
const MaxDeliveriesAdvisorySchema = z.object({
  timestamp: z.string().optional(),
  stream: z.string(),
  consumer: z.string(),
  stream_seq: z.number(),
  deliveries: z.number(),
});

/** Options of {@link startControlPlane}. */
export interface ControlPlaneOptions extends ControlDeps {
  /** The queue group of the hosting process's replicas, which share the cancel requests. */
  queue: string;
  /**
   * How often orphaned work-queue messages are looked for while calls come and go, in ms.
   * Default 30 000.
   */
  reconcileEveryMs?: number;
  /**
   * Shown every final message the deadline keeper sees go by, so the process needs no second
   * subscription to the results (the resolver counts its sessions' calls in flight with it).
   */
  onResult?: (result: FinalSeen) => void;
}

/** The parts of the mesh that keep the guarantees once a call is accepted. */
export interface ControlPlane {
  /** Moves a stream message to the dead-letter stream and ends its call with an error. */
  deadLetter(stream: string, seq: number, reason: string, deliveries?: number): Promise<void>;
  stop(graceMs: number): Promise<void>;
}

// Long enough for the dead-letter keeper to take a call its consumer gave up on.
const SECOND_LOOK_MS = 5_000;

/**
 * Starts the deadline keeper (which watches the work stream: deadline-keeper.ts), the
 * dead-letter keeper (driven by the server's max-deliveries advisories), cancellation
 * requests, and the periodic reconciliation of orphaned messages. Every resolver process runs
 * one; the replicas share the dead-letter consumer and the cancel queue group, and each keeps
 * every deadline (the call store's compare-and-set lets one of them end a call).
 */
export async function startControlPlane(options: ControlPlaneOptions): Promise<ControlPlane> {
  const { nc, plane, subjects, log, workStreamOf } = options;
  const deps: ControlDeps = {
    nc,
    plane,
    subjects,
    log,
    ...(workStreamOf === undefined ? {} : { workStreamOf }),
  };
  const { consumers } = meshPlan(subjects);
  // Advisories are kept in a stream, so a give-up while no resolver runs is handled later.
  await ensureConsumer(plane.jsm, consumers.deadLetters);
  const deadlines = await startDeadlineKeeper(deps, { onResult: options.onResult });
  const cancels: RequestServer = serveRequests({
    nc,
    subject: subjects.allCancel,
    queue: options.queue,
    ...cancelRequests(deps),
  });
  const deadLetters: WorkLoop = await startWorkLoop({
    js: plane.js,
    stream: subjects.streams.advisories,
    consumer: subjects.deadLetterConsumer,
    slots: new Semaphore(8),
    maxMessages: 8,
    handle: (msg) => onMaxDeliveries(deps, msg),
    onConsumerUnavailable: warnUnavailable(log, subjects.deadLetterConsumer),
    onError: (err) => log.error({ err }, "dead-letter keeper error"),
  });
  return new RunningControlPlane(deps, { deadlines, cancels, deadLetters }, options);
}

/** What a running control plane started, and stops in turn. */
interface ControlParts {
  deadlines: DeadlineKeeper;
  cancels: RequestServer;
  deadLetters: WorkLoop;
}

/**
 * A started control plane: its keepers, and when it looks again for deadlines and orphaned
 * work-queue messages (at its start, after each return of the connection, and while calls come
 * and go).
 */
class RunningControlPlane implements ControlPlane {
  readonly #deps: ControlDeps;
  readonly #parts: ControlParts;
  /** Calls found below their ack floor: a second pass acts on them, soon after the first. */
  readonly #suspects = new Set<string>();
  readonly #reconcileTimer: NodeJS.Timeout;
  readonly #stopFollowing: () => void;
  #stopped = false;

  constructor(deps: ControlDeps, parts: ControlParts, options: ControlPlaneOptions) {
    this.#deps = deps;
    this.#parts = parts;
    // Orphans come with a server restart: look as soon as it is back (or this resolver starts,
    // maybe after one), and now and then. Work and results published while this process was
    // away are caught up by reading the work stream again.
    this.#replayDeadlines();
    this.#reconcile();
    // An idle mesh makes no orphans: the periodic look waits for traffic since the last one.
    let trafficSeen = parts.deadlines.traffic;
    this.#reconcileTimer = setInterval(() => {
      if (parts.deadlines.traffic === trafficSeen) return;
      trafficSeen = parts.deadlines.traffic;
      this.#reconcile();
    }, options.reconcileEveryMs ?? Defaults.reconcileEveryMs);
    this.#reconcileTimer.unref();
    this.#stopFollowing = followStatus(deps.nc, {
      reconnect: () => {
        this.#replayDeadlines();
        setTimeout(() => this.#reconcile(), 1_000).unref();
      },
    });
  }

  /** Moves a stream message to the dead-letter stream and ends its call with an error. */
  deadLetter(stream: string, seq: number, reason: string, deliveries?: number): Promise<void> {
    return deadLetter(this.#deps, stream, seq, reason, deliveries);
  }

  /** Stops looking and keeping; requests and dead letters in hand finish within `graceMs`. */
  async stop(graceMs: number): Promise<void> {
    this.#stopped = true;
    this.#stopFollowing();
    clearInterval(this.#reconcileTimer);
    this.#parts.deadlines.stop();
    await Promise.all([this.#parts.cancels.stop(graceMs), this.#parts.deadLetters.stop(graceMs)]);
  }

  #replayDeadlines(): void {
    this.#parts.deadlines.replay().catch((err: unknown) => {
      this.#deps.log.warn({ err }, "cannot read the work stream for deadlines; will try again");
      if (!this.#stopped) setTimeout(() => this.#replayDeadlines(), SECOND_LOOK_MS).unref();
    });
  }

  #reconcile(): void {
    const { plane, subjects, log } = this.#deps;
    const suspects = this.#suspects;
    reconcileOrphans({
      jsm: plane.jsm,
      js: plane.js,
      subjects,
      store: plane.store,
      log,
      suspects,
    }).then(
      (outcome) => {
        if (outcome.deleted > 0) log.info(outcome, "orphaned messages reconciled");
        if (suspects.size > 0 && !this.#stopped)
          setTimeout(() => this.#reconcile(), SECOND_LOOK_MS).unref();
      },
      (err: unknown) =>
        log.warn({ err }, "reconciliation of orphaned messages failed; will try again"),
    );
  }
}

/**
 * Ends an accepted call of the session with `cancelled`; the key names a call of this
 * session only (records are keyed by session). When no call has the key yet, a cancelled
 * record is left for it: a call that arrives with the key later is answered from it and never
 * runs (`pending`).
 */
export async function cancelCall(
  deps: ControlDeps,
  callId: string,
  sessionId: string,
  key: string,
  address: { tenant: string; session: string },
): Promise<CancelReply> {
  const { nc, plane, subjects } = deps;
  const { store, clock } = plane;
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
      // Heard only by the executors of the tool's owner: its account imports its own aborts.
      const stream = deps.workStreamOf?.(record.tool) ?? subjects.streams.work;
      if (won)
        publishEphemeral(nc, subjects.abortOf(stream), {
          call_key: callKey(address, key),
          reason: "cancelled",
        } satisfies AbortMessage);
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
    if (early.status === "new") return { cancelled: false, state: "pending", idempotency_key: key };
    // The resolver accepted the call meanwhile: cancel it as an accepted call.
  }
}

/** How cancel requests are served (`{p}.v1.cancel.{tenant}.{session}`, queue group of the resolvers). */
export function cancelRequests(deps: ControlDeps): RequestKind<undefined> {
  const { subjects, log } = deps;
  return {
    log,
    what: "cancel request",
    maxRequestBytes: Defaults.maxSmallRequestBytes,
    refusal: (error): CancelReply => ({ cancelled: false, state: "unknown", error }),
    handle: async (body, msg): Promise<CancelReply> => {
      const address = subjects.parseSessionSubject(msg.subject);
      if (address === undefined) {
        throw new ToolmeshError(
          ErrorCode.InvalidRequest,
          `cancel subject "${msg.subject}" holds a token no session id maps to`,
          { details: { subject: msg.subject } },
        );
      }
      const request = parseRequest(CancelRequestSchema, body, "malformed cancel request");
      if (subjectToken(request.session_id) !== address.session) {
        throw new ToolmeshError(
          ErrorCode.InvalidRequest,
          "session_id does not match the session of the subject",
          { details: { session_id: request.session_id } },
        );
      }
      const key = idempotencyKeyOf(request, request.tool_call_id);
      return cancelCall(deps, request.tool_call_id, request.session_id, key, address);
    },
  };
}

/** Answers one cancel request (see {@link cancelRequests}). */
export function answerCancel(deps: ControlDeps, msg: Msg): Promise<void> {
  return answerRequest(msg, cancelRequests(deps));
}

/** One max-deliveries advisory (durable consumer on the advisories stream): dead-letters its message. */
export async function onMaxDeliveries(deps: ControlDeps, msg: JsMsg): Promise<void> {
  const advisory = MaxDeliveriesAdvisorySchema.safeParse(decodeJsonOrUndefined(msg.data));
  if (!advisory.success) {
    msg.ack();
    return;
  }
  const { stream, stream_seq: seq, deliveries } = advisory.data;
  // The advisories stream keeps every stream's; only calls and work are dead-lettered.
  if (!deps.subjects.isCallsStream(stream) && !deps.subjects.isWorkStream(stream)) {
    msg.ack();
    return;
  }
  try {
    const stored = await deps.plane.jsm.streams.getMessage(stream, { seq });
    // Gone: another resolver handled it.
    if (stored !== null && !(await requeueIfUsedUp(deps, advisory.data, stored)))
      await deadLetter(deps, stream, seq, "max_deliveries", deliveries, stored);
    msg.ack();
  } catch (err) {
    deps.log.error({ err, stream, seq }, "cannot dead-letter a message yet; will try again");
    msg.nak(5_000);
  }
}

/**
 * Queues work once more, instead of dead-lettering it, when its deliveries ran out faster than
 * its consumer's ack wait allows: at least three of them were handed back at once or never
 * reached anybody. nats-server 2.9.10 counts a delivery into a pull request whose requester is
 * gone (an executor behind a leaf link that was cut) and delivers again at once, so a cut link
 * can use up a call's deliveries in milliseconds (ADR 0030). Work that wore out its ack waits
 * (an executor that dies or hangs on it) and work queued once already are dead-lettered.
 *
 * @returns whether the work went back to its queue
 */
export async function requeueIfUsedUp(
  deps: ControlDeps,
  advisory: z.infer<typeof MaxDeliveriesAdvisorySchema>,
  stored: StoredMsg,
): Promise<boolean> {
  const { plane, subjects, log } = deps;
  const { stream, consumer, stream_seq: seq, deliveries, timestamp } = advisory;
  if (!subjects.isWorkStream(stream) || timestamp === undefined) return false;
  if (stored.header?.has(Header.Requeued) === true) return false;
  const { config } = await plane.jsm.consumers.info(stream, consumer);
  const ackWaitMs = (config.ack_wait ?? 30_000_000_000) / 1_000_000; // the server's default
  const spentMs = Date.parse(timestamp) - stored.time.getTime();
  if (!(spentMs < (deliveries - 2) * ackWaitMs)) return false;
  const headers = createHeaders();
  for (const [key, values] of stored.header ?? []) {
    // Without the record's revision the executor reads the record: the call may have moved on.
    if (key === Header.MsgId || key === Header.RecordRevision || key === Header.ArgsHash) continue;
    for (const value of values) headers.append(key, value);
  }
  headers.set(Header.Requeued, String(deliveries));
  await plane.js.publish(stored.subject, stored.data, {
    headers,
    msgID: requeueMsgId(stream, seq),
  });
  await plane.jsm.streams.deleteMessage(stream, seq).catch(() => false);
  log.warn(
    { stream, seq, consumer, deliveries, spent_ms: spentMs, ack_wait_ms: ackWaitMs },
    "work used up its deliveries faster than its ack wait allows; queued once more",
  );
  return true;
}

/**
 * Moves a message of the calls or work stream to `{p}.v1.dlq.{tool}`, ends its call with a
 * non-retryable `tool_error` (`details.dead_letter: true`) and deletes it from its stream. A
 * message already gone was handled by another resolver. `read` is the message when the caller
 * has read it already.
 */
export async function deadLetter(
  deps: ControlDeps,
  stream: string,
  seq: number,
  reason: string,
  deliveries = 0,
  read?: StoredMsg,
): Promise<void> {
  const { plane, subjects, log } = deps;
  const { js, jsm } = plane;
  const stored = read ?? (await jsm.streams.getMessage(stream, { seq }));
  if (stored === null) return; // already handled by another resolver
  const body = decodeJsonOrUndefined(stored.data);
  const work = subjects.isWorkStream(stream) ? ResolvedCallSchema.safeParse(body) : undefined;
  const request = subjects.isCallsStream(stream) ? CallRequestSchema.safeParse(body) : undefined;
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
    msgID: deadLetterMsgId(stream, seq),
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
        { attempts: deliveries },
      );
      const target = {
        address,
        call_id: callId,
        idempotency_key: idempotencyKeyOf({ ...request?.data, session_id: sessionId }, callId),
      };
      // A call accepted before its message was given up ends by compare-and-set, as every call
      // does: if it ended already, its final message stays the only one. A key held by another
      // call id is that call's; this id is answered under a message id of its own.
      const known = await plane.store.get(target);
      if (known === undefined || known.record.call_id === callId)
        await plane.finalize(target, message, known);
      else
        await publishDurable(js, subjects.result(address, callId), message, {
          msgId: resultMsgId(callKey(address, target.idempotency_key), subjectToken(callId)),
          headers: finalHeaders(message),
        });
    }
  }
  await jsm.streams.deleteMessage(stream, seq).catch(() => false);
  log.warn({ stream, seq, tool, reason, deliveries }, "message moved to the dead-letter stream");
}
