import type { NatsConnection } from "@nats-io/nats-core";
import type { JsMsg } from "@nats-io/jetstream";
import type {
  ProgressEvent,
  ResolvedCall,
  Subjects,
  ToolDefinition,
  ToolMessage,
} from "@toolmesh/protocol";
import {
  ErrorCode,
  ResolvedCallSchema,
  RetryableError,
  ToolmeshError,
  callKey,
  scopedIdempotencyKey,
  decodeJson,
  encodeJson,
  ensureError,
  errorToolMessage,
  isRetryableByDefault,
} from "@toolmesh/protocol";
import pRetry from "p-retry";
import { knownRecordOf } from "@toolmesh/call-store";
import type { CallPlane, CallRecord } from "@toolmesh/call-store";
import { ServerClock, handBackDelayMs } from "@toolmesh/nats";
import type { Logger, Tracer } from "@toolmesh/telemetry";
import {
  ATTR_TOOLMESH_ATTEMPT,
  ATTR_TOOLMESH_CALL_ID,
  ATTR_TOOLMESH_SESSION_ID,
  ATTR_TOOLMESH_TOOL,
  lazyChild,
  linkableContext,
  processSpanOptions,
  withSpan,
} from "@toolmesh/telemetry";
import type { ToolContext, ToolModule } from "./tool-module.js";
import type { AttemptOutcome, AttemptTelemetry } from "./attempt-telemetry.js";
import type { FreshWork } from "./fresh-work.js";
import type { UserSecretStore } from "./user-secrets.js";
import type { DelegatedCredentials } from "./delegation.js";

/** A tool this executor serves: its module, its registry entry and its preset values. */
export interface ServedTool {
  module: ToolModule;
  definition: ToolDefinition;
  presets: Record<string, unknown>;
}

/** What {@link handleWork} needs of its executor. Durations in ms, sizes in bytes. */
export interface WorkDeps {
  nc: NatsConnection;
  subjects: Subjects;
  /** Streams, call store and server clock. */
  plane: CallPlane;
  log: Logger;
  tracer: Tracer;
  telemetry: AttemptTelemetry;
  /** Toolkit-level execution context, the lowest priority. */
  toolkitContext: Record<string, unknown>;
  /** The work consumers' ack wait: how long recording an outcome is retried past the deadline. */
  ackWaitMs: number;
  /** Largest final message; a larger result ends the call with `payload_too_large`. */
  maxResultBytes: number;
  /** Running attempts by call key, for the abort broadcast and shutdown to abort. */
  running: Map<string, AbortController>;
  /** Calls this process is handling, by call key: a redelivery of one waits for it. */
  inHand: Map<string, Promise<void>>;
  /** Aborted when the executor stops for good: ends the retries of recording outcomes. */
  shutdown: AbortController;
  /** When a first delivery may skip reading its record. */
  freshWork: FreshWork;
  /** Users' secrets, for tools whose `credentials` are `user-secret`. */
  userSecrets?: UserSecretStore | undefined;
  /** Delegated tokens, for tools whose `credentials` are `token-exchange`. */
  delegated?: DelegatedCredentials | undefined;
}

/** Marks the error of an attempt stopped because its executor is shutting down. */
export const ShutdownCode = "executor_shutdown";
/**
 * Why an attempt's signal fires once the attempt is over (it frees what the handler hung on
 * it). One instance: building an error, with its stack, per call is a measurable cost.
 */
const ATTEMPT_FINISHED = new ToolmeshError(ErrorCode.Cancelled, "attempt finished");

/**
 * Handles one delivery of a tool's work: runs the call unless it ended already, then ends it
 * with its outcome, hands it back for a retry, or hands it back because the executor stops.
 * A redelivered call that already ended is answered from its stored result and not run again.
 */
export async function handleWork(deps: WorkDeps, tool: ServedTool, msg: JsMsg): Promise<void> {
  const { log, tracer, telemetry, plane } = deps;
  plane.clock.observe(ServerClock.timestampOf(msg));
  let call: ResolvedCall;
  try {
    call = ResolvedCallSchema.parse(decodeJson(msg.data));
  } catch (err) {
    // Only a foreign publisher can put this here; nobody can be answered. Kept for people.
    log.error(
      { err, tool: tool.definition.name, seq: msg.seq },
      "work message is not a resolved call",
    );
    await publishDeadLetter(deps, tool, msg, "not a resolved call").then(
      () => msg.ack(),
      () => msg.nak(1_000),
    );
    return;
  }
  const attempt = msg.info.deliveryCount;
  const callLog = lazyChild(log, {
    callId: call.call_id,
    sessionId: call.session_id,
    tool: call.tool,
    attempt,
  });
  await withSpan(
    tracer,
    `process ${call.tool}`,
    {
      ...processSpanOptions(msg, {
        [ATTR_TOOLMESH_CALL_ID]: call.call_id,
        [ATTR_TOOLMESH_SESSION_ID]: call.session_id,
        [ATTR_TOOLMESH_TOOL]: call.tool,
        [ATTR_TOOLMESH_ATTEMPT]: attempt,
      }),
      links: telemetry.linksFor(call, attempt),
    },
    async (span) => {
      telemetry.remember(call, linkableContext(span));
      await handleAttempt({ deps, tool, call, msg, attempt, callLog });
    },
  );
}

/** One delivery of a call being handled, and what it is handled with. */
interface WorkDelivery {
  deps: WorkDeps;
  tool: ServedTool;
  call: ResolvedCall;
  msg: JsMsg;
  attempt: number;
  callLog: Logger;
}

/**
 * Handles one delivery of a parsed call: holds it against another delivery in hand, reads its
 * record when it must, answers an ended call from its record, else runs the attempt and acts
 * on its outcome. A failure to record or publish hands the delivery back.
 */
async function handleAttempt(work: WorkDelivery): Promise<void> {
  const { deps, call, msg, attempt, callLog } = work;
  const inHandKey = callKey(call.address, call.idempotency_key);
  // A restart of the server can lose this process's heartbeats, and the server then
  // delivers a call again while it still runs or its outcome is being recorded here:
  // wait for that, then read the record, instead of running the call twice.
  const { waited, release } = await holdCall(deps.inHand, inHandKey);
  try {
    const stored = await storedRecord(work, inHandKey, waited);
    if (stored?.record.state === "done" && stored.record.result !== undefined) {
      // Ended already (result, cancellation or deadline): don't run it. Its answer is
      // published again only if the sessions stream lacks it.
      await deps.plane.finalize(call, stored.record.result);
      msg.ack();
      callLog.info("call already ended; answered from its stored result");
      return;
    }
    await runAndSettle(work, stored);
  } catch (err) {
    callLog.error({ err }, "cannot record or publish the outcome; the call will be redelivered");
    msg.nak(handBackDelayMs(attempt));
  } finally {
    deps.telemetry.deliverySettled(call);
    release();
  }
}

/** The call's record: the one its work carries when that is trusted (ADR 0027), else read. */
async function storedRecord(
  { deps, call, msg, attempt }: WorkDelivery,
  inHandKey: string,
  waited: boolean,
): Promise<{ record: CallRecord; revision: number } | undefined> {
  const { clock, store } = deps.plane;
  // A young first delivery carries its record's revision: no read (ADR 0027).
  const trusted =
    deps.freshWork.trusts({
      consumer: msg.info.consumer,
      key: inHandKey,
      seq: msg.seq,
      pending: msg.info.pending,
      deliveryCount: attempt,
      ageMs: clock.now() - ServerClock.timestampOf(msg),
    }) && !waited;
  return (trusted ? knownRecordOf(call, msg.headers) : undefined) ?? (await store.get(call));
}

/** Runs the attempt, then hands the call back, retries it, or ends it with its outcome. */
async function runAndSettle(
  work: WorkDelivery,
  stored: { record: CallRecord; revision: number } | undefined,
): Promise<void> {
  const { deps, tool, call, msg, attempt, callLog } = work;
  const { telemetry, plane } = deps;
  const { clock } = plane;
  const started = performance.now();
  const outcome = await telemetry.execute(
    tool.definition,
    call,
    attempt,
    attempt === 1 ? (clock.now() - call.resolved_at) / 1000 : undefined,
    () => runAttempt(work),
  );
  const durationMs = Math.round((performance.now() - started) * 1000) / 1000;
  const code = outcome.ok ? undefined : outcome.error.code;
  const next = afterAttempt(outcome, attempt, tool.definition, call.deadline_at, clock.now());
  if (next.kind === "hand-back") {
    telemetry.attemptEnded(call, code, true);
    msg.nak(); // handed back: another executor takes it
    callLog.info("executor shutting down; call handed back");
    return;
  }
  if (next.kind === "retry") {
    telemetry.attemptEnded(call, code, true);
    callLog.warn(
      {
        code: next.error.code,
        err: next.error,
        retry_in_ms: next.delayMs,
        duration_ms: durationMs,
      },
      "attempt failed; retrying",
    );
    msg.nak(next.delayMs);
    return;
  }
  const { message, encoded } = finalMessage(
    call,
    outcome,
    attempt,
    durationMs,
    deps.maxResultBytes,
  );
  telemetry.attemptEnded(call, code, false);
  const { won, retried } = await recordOutcome(deps, call, { message, encoded }, stored, callLog);
  msg.ack();
  await releaseDelegation(deps, tool, call, callLog);
  if (won) telemetry.callEnded(call, message.error?.code, (clock.now() - call.resolved_at) / 1000);
  if (!won && retried) callLog.info("call ended; its outcome was recorded after retrying");
  else if (!won)
    callLog.info("call had already ended (cancelled or past its deadline); result dropped");
  else if (outcome.ok)
    callLog.info(
      {
        ...loggedArguments(call, msg.data.length),
        duration_ms: durationMs,
        result_chars: message.content.length,
      },
      "call succeeded",
    );
  else
    callLog.info(
      {
        ...loggedArguments(call, msg.data.length),
        duration_ms: durationMs,
        code: outcome.error.code,
        err: outcome.error,
      },
      "call failed",
    );
}

/** Work messages up to this size have their arguments in the log line of their outcome. */
const LOGGED_ARGUMENTS_MAX_BYTES = 8 * 1024;

/**
 * The arguments of a call as its outcome's log line carries them: whole when its work message
 * (`messageBytes`) is small, else only that message's size (`work_bytes`), so that a call of
 * large arguments neither writes a line of that size nor pays for serializing it.
 */
function loggedArguments(
  call: Pick<ResolvedCall, "arguments">,
  messageBytes: number,
): { args: ResolvedCall["arguments"] } | { work_bytes: number } {
  return messageBytes <= LOGGED_ARGUMENTS_MAX_BYTES
    ? { args: call.arguments }
    : { work_bytes: messageBytes };
}

/**
 * Waits until no other delivery of the call is in hand in this process, then holds it:
 * `waited` says whether one was, `release` lets the next one go.
 */
export async function holdCall(
  inHand: Map<string, Promise<void>>,
  key: string,
): Promise<{ waited: boolean; release: () => void }> {
  let waited = false;
  for (let earlier = inHand.get(key); earlier !== undefined;) {
    waited = true;
    await earlier;
    earlier = inHand.get(key);
  }
  let handled = (): void => undefined;
  inHand.set(
    key,
    new Promise<void>((resolve) => {
      handled = resolve;
    }),
  );
  return {
    waited,
    release: () => {
      inHand.delete(key);
      handled();
    },
  };
}

/** What becomes of a delivery once its attempt is over. */
export type AfterAttempt =
  | { kind: "hand-back" }
  | { kind: "retry"; delayMs: number; error: ToolmeshError }
  | { kind: "end" };

/**
 * What becomes of a delivery once its attempt is over: handed back when the executor is
 * stopping, retried after {@link retryDelay} when the failure allows one before the deadline,
 * else the call ends with the outcome. Times in epoch ms.
 */
export function afterAttempt(
  outcome: AttemptOutcome,
  attempt: number,
  definition: Pick<ToolDefinition, "retry">,
  deadlineAt: number,
  now: number,
): AfterAttempt {
  if (outcome.ok) return { kind: "end" };
  if (outcome.error.details?.[ShutdownCode] === true) return { kind: "hand-back" };
  const delayMs = retryDelay(outcome.error, attempt, definition, deadlineAt, now);
  return delayMs === undefined ? { kind: "end" } : { kind: "retry", delayMs, error: outcome.error };
}

/**
 * The final message of a call that ends with this attempt's outcome, with its UTF-8 JSON bytes
 * (made to measure it, and kept so that it is not serialized again); a result larger than
 * `maxResultBytes` encoded becomes a `payload_too_large` error.
 */
export function finalMessage(
  call: Pick<ResolvedCall, "tool_call_id" | "tool" | "session_id">,
  outcome: AttemptOutcome,
  attempt: number,
  durationMs: number,
  maxResultBytes: number,
): { message: ToolMessage; encoded: Uint8Array } {
  const target = {
    tool_call_id: call.tool_call_id,
    name: call.tool,
    session_id: call.session_id,
  };
  const extra = { attempts: attempt, duration_ms: durationMs };
  const message: ToolMessage = outcome.ok
    ? { role: "tool", ...target, content: outcome.content, ...extra }
    : errorToolMessage(target, outcome.error, extra);
  const encoded = encodeJson(message);
  const bytes = encoded.length;
  if (bytes <= maxResultBytes) return { message, encoded };
  const refused = errorToolMessage(
    target,
    new ToolmeshError(
      ErrorCode.PayloadTooLarge,
      `the result is ${bytes} bytes; results may have at most ${maxResultBytes}`,
      {
        retryable: false,
        details: { bytes, limit: maxResultBytes },
      },
    ),
    extra,
  );
  return { message: refused, encoded: encodeJson(refused) };
}

/**
 * Ends the call with the outcome of a finished attempt. While the server is unreachable (a
 * restart) it tries again, with backoff, until the call's deadline and one ack wait have
 * passed: giving up would throw the finished work away and run the call again.
 */
async function recordOutcome(
  deps: WorkDeps,
  call: ResolvedCall,
  { message, encoded }: { message: ToolMessage; encoded: Uint8Array },
  stored: { record: CallRecord; revision: number } | undefined,
  callLog: Logger,
): Promise<{ won: boolean; retried: boolean }> {
  const { plane } = deps;
  let known = stored;
  let retried = false;
  const won = await pRetry(
    async () => {
      try {
        return await plane.finalize(call, message, known, undefined, encoded);
      } catch (err) {
        known = undefined; // the record may have changed: read it again
        throw err;
      }
    },
    {
      retries: Number.POSITIVE_INFINITY,
      // Short waits: the outcome should go out as soon as the server is back.
      minTimeout: 100,
      maxTimeout: 1_000,
      maxRetryTime: Math.max(0, call.deadline_at - plane.clock.now()) + deps.ackWaitMs,
      signal: deps.shutdown.signal,
      shouldRetry: ({ error }) => ensureError(error).retryable,
      onFailedAttempt: ({ error, attemptNumber }) => {
        retried = true;
        if (attemptNumber === 1)
          callLog.warn({ err: error }, "cannot record the outcome yet; retrying");
      },
    },
  );
  return { won, retried };
}

async function publishDeadLetter(
  deps: WorkDeps,
  tool: ServedTool,
  msg: JsMsg,
  reason: string,
): Promise<void> {
  await deps.plane.deadLetter({
    tool: tool.definition.name,
    reason,
    stream: msg.info.stream,
    subject: msg.subject,
    seq: msg.seq,
    deliveries: msg.info.deliveryCount,
    data: msg.data,
    headers: msg.headers,
  });
}

/** One attempt of a call: what its delivery is handled with, less the message. */
type CallAttempt = Omit<WorkDelivery, "msg">;

/**
 * Runs the tool's handler once for the call, within the attempt's timeout and the call's
 * deadline, once the tool is ready and its credential known; what it returned or threw.
 */
async function runAttempt(run: CallAttempt): Promise<AttemptOutcome> {
  const { deps, tool, call, attempt } = run;
  const { clock } = deps.plane;
  if (tool.module.ready !== undefined) {
    // The attempt's clock starts once the tool can take it (a restarted MCP server).
    const waited = await untilReady(tool.module.ready, call.deadline_at - clock.now(), call);
    if (waited !== undefined) return { ok: false, error: waited };
  }
  const remaining = call.deadline_at - clock.now();
  if (remaining <= 0) {
    return { ok: false, error: deadlineError(call) };
  }
  let credential: string | undefined;
  try {
    credential = await credentialOf(deps, tool, call);
  } catch (err) {
    return { ok: false, error: ensureError(err) };
  }
  // The caller may lower the tool's attempt timeout, never raise it.
  const attemptTimeoutMs = Math.min(
    tool.definition.timeout_ms,
    call.attempt_timeout_ms ?? Infinity,
  );
  const timeoutMs = Math.min(attemptTimeoutMs, remaining);
  const controller = new AbortController();
  const key = callKey(call.address, call.idempotency_key);
  deps.running.set(key, controller);
  const timer = setTimeout(() => {
    controller.abort(
      timeoutMs < attemptTimeoutMs
        ? deadlineError(call)
        : new ToolmeshError(
            ErrorCode.Timeout,
            `attempt ${attempt} of "${call.tool}" timed out after ${timeoutMs} ms`,
            { details: { timeout_ms: timeoutMs, attempt } },
          ),
    );
  }, timeoutMs);
  const ctx = toolContextOf(run, controller.signal, credential);
  try {
    const args = { ...call.arguments, ...tool.presets };
    const value = await Promise.race([
      Promise.resolve().then(() => tool.module.handler(args, ctx)),
      abortion(controller.signal),
    ]);
    return { ok: true, content: toContent(value) };
  } catch (err) {
    const error = controller.signal.aborted
      ? ensureError(controller.signal.reason)
      : handlerError(err);
    return { ok: false, error };
  } finally {
    clearTimeout(timer);
    deps.running.delete(key);
    if (!controller.signal.aborted) {
      controller.abort(ATTEMPT_FINISHED);
    }
  }
}

/**
 * What the handler of one attempt is given: the call, its contexts merged, the attempt's
 * signal, and `emit`, which publishes progress when the tool declares it.
 */
function toolContextOf(
  { deps, tool, call, attempt, callLog }: CallAttempt,
  signal: AbortSignal,
  credential: string | undefined,
): ToolContext {
  let seq = 0;
  return {
    callId: call.call_id,
    idempotencyKey: scopedIdempotencyKey(call.address, call.idempotency_key),
    sessionId: call.session_id,
    tool: call.tool,
    attempt,
    ...(call.identity === undefined ? {} : { identity: call.identity }),
    ...(credential === undefined ? {} : { credential }),
    context: { ...deps.toolkitContext, ...call.agent_context, ...call.context },
    signal,
    deadlineAt: call.deadline_at + deps.plane.clock.offsetMs,
    log: callLog,
    emit(data) {
      if (!tool.definition.progress) {
        if (seq++ === 0) callLog.warn("tool emitted progress without declaring it; dropped");
        return;
      }
      if (signal.aborted) return;
      const event: ProgressEvent = {
        tool_call_id: call.tool_call_id,
        name: call.tool,
        session_id: call.session_id,
        seq: seq++,
        attempt,
        data,
        at: Date.now(),
      };
      try {
        deps.plane.publishProgress(call, event);
      } catch (err) {
        callLog.warn({ err }, "cannot publish progress");
      }
    },
  };
}

/** Purges the call's delegation grant once the call has ended; a failure is logged. */
async function releaseDelegation(
  deps: WorkDeps,
  tool: ServedTool,
  call: ResolvedCall,
  callLog: Logger,
): Promise<void> {
  const declared = tool.definition.credentials;
  if (declared?.type !== "token-exchange" || deps.delegated === undefined) return;
  try {
    await deps.delegated.release(call, declared);
  } catch (err) {
    callLog.warn({ err }, "cannot purge the call's delegation grant");
  }
}

/** The credential the tool acts with for this call's caller, when it declares one. */
async function credentialOf(
  deps: WorkDeps,
  tool: ServedTool,
  call: ResolvedCall,
): Promise<string | undefined> {
  const declared = tool.definition.credentials;
  if (declared?.type === "token-exchange") {
    // startExecutor refuses token-exchange tools without a token endpoint.
    if (deps.delegated === undefined)
      throw new ToolmeshError(ErrorCode.Internal, "no delegated credentials in this executor");
    return deps.delegated.tokenFor(call, declared);
  }
  if (declared?.type !== "user-secret") return undefined;
  // startExecutor refuses user-secret tools without a store; this is a bug if it happens.
  if (deps.userSecrets === undefined)
    throw new ToolmeshError(ErrorCode.Internal, "no user-secret store in this executor");
  return deps.userSecrets.secretFor(call.tool, call.identity);
}

function safeStringify(value: unknown): string {
  try {
    return JSON.stringify(value) ?? String(value);
  } catch {
    return String(value);
  }
}

const WIRE_CODES: ReadonlySet<string> = new Set(Object.values(ErrorCode));

/**
 * What a handler threw, as a typed error. Plain exceptions are `tool_error` and retryable
 * (as in Temporal) unless they say otherwise: a thrown object's own `retryable` boolean and
 * wire `code` are honoured, so tools need not import toolmesh to throw typed errors.
 */
export function handlerError(err: unknown): ToolmeshError {
  if (err instanceof ToolmeshError) return err;
  const shape = (typeof err === "object" && err !== null ? err : {}) as {
    code?: unknown;
    retryable?: unknown;
    details?: unknown;
    message?: unknown;
  };
  const code =
    typeof shape.code === "string" && WIRE_CODES.has(shape.code)
      ? (shape.code as ErrorCode)
      : ErrorCode.ToolError;
  const details =
    typeof shape.details === "object" && shape.details !== null && !Array.isArray(shape.details)
      ? (shape.details as Record<string, unknown>)
      : undefined;
  const message =
    err instanceof Error
      ? err.message
      : typeof shape.message === "string"
        ? shape.message
        : typeof err === "object" && err !== null
          ? `tool threw ${safeStringify(err)}`
          : String(err);
  return new ToolmeshError(code, message, {
    // A plain exception of the tool is worth another attempt; a typed code keeps its default.
    retryable:
      typeof shape.retryable === "boolean"
        ? shape.retryable
        : code === ErrorCode.ToolError || isRetryableByDefault(code),
    ...(details === undefined ? {} : { details }),
    cause: err,
  });
}

function deadlineError(call: ResolvedCall): ToolmeshError {
  return new ToolmeshError(ErrorCode.DeadlineExceeded, `call ${call.call_id} passed its deadline`, {
    details: { deadline_at: call.deadline_at, timeout_ms: call.timeout_ms },
  });
}

function abortion(signal: AbortSignal): Promise<never> {
  return new Promise((_, reject) => {
    signal.addEventListener("abort", () => reject(signal.reason as Error), { once: true });
  });
}

/** Strings stay as they are; nothing becomes ""; other values become JSON. */
export function toContent(value: unknown): string {
  if (typeof value === "string") return value;
  if (value === undefined || value === null) return "";
  let text: string | undefined;
  try {
    text = JSON.stringify(value);
  } catch (err) {
    throw new ToolmeshError(ErrorCode.ToolError, "the tool's result cannot be converted to JSON", {
      retryable: false,
      cause: err,
    });
  }
  if (text === undefined) {
    // Functions, symbols and toJSON() returning undefined have no JSON form.
    throw new ToolmeshError(
      ErrorCode.ToolError,
      `the tool returned a ${typeof value} that has no JSON form`,
      {
        retryable: false,
      },
    );
  }
  return text;
}

/**
 * The delay before the next attempt, or undefined when the failure is final: not
 * retryable, excluded by the policy, out of attempts, or the next attempt would start past
 * the deadline. Exponential backoff, at least the handler's `retryAfterMs`.
 */
export function retryDelay(
  error: ToolmeshError,
  attempt: number,
  definition: Pick<ToolDefinition, "retry">,
  deadlineAt: number,
  now = Date.now(),
): number | undefined {
  const policy = definition.retry;
  if (!error.retryable || error.code === ErrorCode.DeadlineExceeded) return undefined;
  if (policy.non_retryable_codes.includes(error.code)) return undefined;
  if (attempt >= policy.max_attempts) return undefined;
  let delay = Math.min(
    policy.initial_backoff_ms * policy.backoff_multiplier ** (attempt - 1),
    policy.max_backoff_ms,
  );
  if (error instanceof RetryableError && error.retryAfterMs !== undefined)
    delay = Math.max(delay, error.retryAfterMs);
  if (now + delay >= deadlineAt) return undefined;
  return Math.round(delay);
}

/** Waits for a tool to be ready, at most until the deadline; the error that ended the wait. */
async function untilReady(
  ready: (signal: AbortSignal) => Promise<void>,
  remainingMs: number,
  call: ResolvedCall,
): Promise<ToolmeshError | undefined> {
  if (remainingMs <= 0) return deadlineError(call);
  const waiting = new AbortController();
  const timer = setTimeout(() => waiting.abort(deadlineError(call)), remainingMs);
  try {
    await ready(waiting.signal);
    return undefined;
  } catch (err) {
    return ensureError(waiting.signal.aborted ? waiting.signal.reason : err, ErrorCode.Unavailable);
  } finally {
    clearTimeout(timer);
  }
}
