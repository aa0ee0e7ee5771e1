import type { NatsConnection, Subscription } from "@nats-io/nats-core";
import type { JetStreamManager, JsMsg } from "@nats-io/jetstream";
import type {
  ProgressEvent,
  ResolvedCall,
  Subjects,
  ToolDefinition,
  ToolMessage,
} from "@toolmesh/protocol";
import {
  Defaults,
  ErrorCode,
  ResolvedCallSchema,
  RetryableError,
  ToolDefinitionSchema,
  ToolmeshError,
  callKey,
  scopedIdempotencyKey,
  decodeJson,
  decodeJsonOrUndefined,
  encodeJson,
  ensureError,
  errorToolMessage,
  isRetryableByDefault,
  summarize,
} from "@toolmesh/protocol";
import pRetry from "p-retry";
import { openCallPlane } from "@toolmesh/call-store";
import type { StreamLimits, WorkLoop } from "@toolmesh/nats";
import {
  Semaphore,
  ServerClock,
  deadLetterHeaders,
  ensureDurableConsumer,
  publishEphemeral,
  startWorkLoop,
} from "@toolmesh/nats";
import type { ToolRegistry } from "@toolmesh/registry";
import type { Logger, Tracer } from "@toolmesh/telemetry";
import {
  ATTR_TOOLMESH_ATTEMPT,
  ATTR_TOOLMESH_CALL_ID,
  ATTR_TOOLMESH_SESSION_ID,
  ATTR_TOOLMESH_TOOL,
  linkableContext,
  processSpanOptions,
  toolmeshMetrics,
  withSpan,
} from "@toolmesh/telemetry";
import type { ToolContext, ToolModule } from "./tool-module.js";
import { AttemptTelemetry } from "./attempt-telemetry.js";

/** Options of {@link startExecutor}. Durations in ms. */
export interface ExecutorOptions {
  nc: NatsConnection;
  subjects: Subjects;
  registry: ToolRegistry;
  tools: readonly ToolModule[];
  log: Logger;
  tracer: Tracer;
  /** Registry owner identity; replicas of one deployment share it. Default `executor`. */
  owner?: string;
  /** Calls run at once by this process, all tools together. Default 16. */
  concurrency?: number;
  /** Toolkit-level execution context, the lowest priority. Default `{}`. */
  toolkitContext?: Record<string, unknown>;
  /** Preset values by tool name from configuration; win over the module's own presets. */
  presets?: Record<string, Record<string, unknown>>;
  streamLimits?: StreamLimits;
  /**
   * How long a delivered call stays owned without a sign of life, in ms; heartbeats keep
   * long calls owned. After a crash the call is redelivered once this passes. Default 10 000.
   */
  ackWaitMs?: number;
  /** How long call records are kept (the idempotency horizon), in ms. Default 24 h. */
  callRetentionMs?: number;
}

/** A running executor. */
export interface Executor {
  /** Names of the tools this executor serves (registration conflicts excluded). */
  readonly tools: readonly string[];
  /**
   * Registers and serves one more tool, or a new definition of one it serves. False when the
   * name belongs to another owner.
   */
  addTool(module: ToolModule): Promise<boolean>;
  /** Stops serving a tool (running calls finish within `graceMs`) and unregisters it. */
  removeTool(name: string, graceMs?: number): Promise<void>;
  /** Stops pulling work and waits for running calls (at most `graceMs`, default 10 s). */
  stop(graceMs?: number): Promise<void>;
  /** Keys (`callKey`) of the calls running right now. */
  inFlight(): readonly string[];
}

interface ServedTool {
  module: ToolModule;
  definition: ToolDefinition;
  presets: Record<string, unknown>;
}

/** The registry entry of a tool module: preset params removed from the model's schema. */
export function toolDefinitionOf(module: ToolModule, owner: string): ToolDefinition {
  const presetNames = Object.keys(module.presets ?? {});
  return ToolDefinitionSchema.parse({
    name: module.name,
    description: module.description,
    summary: module.summary ?? summarize(module.description),
    parameters: withoutParams(module.parameters, presetNames),
    ...(module.groups === undefined ? {} : { groups: module.groups }),
    ...(module.systemParams === undefined ? {} : { system_params: module.systemParams }),
    preset_params: presetNames,
    kind: module.kind ?? "builtin",
    progress: module.progress === true,
    ...(module.annotations === undefined ? {} : { annotations: module.annotations }),
    ...(module.origin === undefined ? {} : { origin: module.origin }),
    owner,
    ...(module.timeoutMs === undefined ? {} : { timeout_ms: module.timeoutMs }),
    ...(module.retry === undefined ? {} : { retry: module.retry }),
  });
}

function withoutParams(
  schema: Record<string, unknown>,
  names: readonly string[],
): Record<string, unknown> {
  if (names.length === 0) return schema;
  const hidden = new Set(names);
  const properties = Object.fromEntries(
    Object.entries((schema.properties ?? {}) as Record<string, unknown>).filter(
      ([k]) => !hidden.has(k),
    ),
  );
  const required = Array.isArray(schema.required)
    ? (schema.required as string[]).filter((k) => !hidden.has(k))
    : undefined;
  return { ...schema, properties, ...(required === undefined ? {} : { required }) };
}

/** Why a running attempt was stopped from outside. */
const ShutdownCode = "executor_shutdown";
/**
 * Why an attempt's signal fires once the attempt is over (it frees what the handler hung on
 * it). One instance: building an error, with its stack, per call is a measurable cost.
 */
const ATTEMPT_FINISHED = new ToolmeshError(ErrorCode.Cancelled, "attempt finished");

/**
 * Registers the tools and consumes their work. Each tool has one durable pull consumer on
 * the work stream shared by every executor serving it, so N processes split the work. The
 * call store decides who ends a call: a redelivered call that already ended is answered from
 * its stored result and not run again.
 */
export async function startExecutor(options: ExecutorOptions): Promise<Executor> {
  const { nc, subjects, registry, log, tracer } = options;
  const owner = options.owner ?? "executor";
  const ackWaitMs = options.ackWaitMs ?? Defaults.ackWaitMs;
  const plane = await openCallPlane(nc, {
    subjects,
    streamLimits: options.streamLimits,
    callRetentionMs: options.callRetentionMs,
  });
  const { jsm, js, store, clock } = plane;
  const slots = new Semaphore(options.concurrency ?? 16);
  const toolkitContext = options.toolkitContext ?? {};
  const running = new Map<string, AbortController>();
  // Calls this process is handling, by key: a redelivery of one waits for it (see handleWork).
  const inHand = new Map<string, Promise<void>>();
  // Ends the retries of recording outcomes when the executor stops for good.
  const shutdown = new AbortController();
  // The call record stores the final message too: leave room for it within one message.
  const maxResultBytes = (options.streamLimits?.maxMessageBytes ?? Defaults.maxMessageBytes) - 4096;
  const served = new Map<string, ServedTool>();
  const metrics = toolmeshMetrics();
  const telemetry = new AttemptTelemetry(tracer, metrics);
  const stopObservingQueues = metrics.observeQueues(() =>
    Promise.all(
      [...served.keys()].map(async (tool) => {
        const info = await jsm.consumers.info(subjects.streams.work, subjects.workConsumer(tool));
        return { tool, pending: info.num_pending, ackPending: info.num_ack_pending };
      }),
    ),
  );

  // Cancellation and deadlines are decided elsewhere and broadcast: abort the attempt here.
  const aborts: Subscription = nc.subscribe(subjects.abort, {
    callback: (err, msg) => {
      if (err !== null) return;
      const body = decodeJsonOrUndefined(msg.data) as
        { call_key?: unknown; reason?: unknown } | undefined;
      const controller =
        typeof body?.call_key === "string" ? running.get(body.call_key) : undefined;
      controller?.abort(
        body?.reason === "deadline_exceeded"
          ? new ToolmeshError(ErrorCode.DeadlineExceeded, "the call passed its deadline")
          : new ToolmeshError(ErrorCode.Cancelled, "the call was cancelled by its caller"),
      );
    },
  });

  const loops = new Map<string, WorkLoop>();

  /** Registers a tool and starts consuming its work; false when another owner has the name. */
  async function serve(module: ToolModule): Promise<boolean> {
    const definition = toolDefinitionOf(module, owner);
    const outcome = await registry.register(definition);
    if (outcome.status === "conflict") return false; // the registry has logged the warning
    const tool: ServedTool = {
      module,
      definition,
      presets: { ...module.presets, ...options.presets?.[module.name] },
    };
    const previous = served.get(definition.name);
    served.set(definition.name, tool);
    if (previous !== undefined && loops.has(definition.name)) {
      // A new definition of a tool already served: the running loop picks it up.
      await ensureWorkConsumer(jsm, subjects, definition, ackWaitMs);
      return true;
    }
    await ensureWorkConsumer(jsm, subjects, definition, ackWaitMs);
    if (previous === undefined) metrics.toolServed(definition.name, 1);
    loops.set(
      definition.name,
      await startWorkLoop({
        js,
        stream: subjects.streams.work,
        consumer: subjects.workConsumer(definition.name),
        slots,
        // Buffered messages are kept owned by heartbeats while they wait for a slot.
        maxMessages: 8,
        heartbeatMs: Math.max(250, Math.floor(ackWaitMs / 3)),
        handle: (msg) => handleWork(served.get(definition.name) ?? tool, msg),
        onError: (err) => log.error({ err, tool: definition.name }, "work loop error"),
      }),
    );
    return true;
  }

  for (const module of options.tools) await serve(module);
  log.info({ tools: [...served.keys()], owner }, "executor started");

  async function handleWork(tool: ServedTool, msg: JsMsg): Promise<void> {
    clock.observe(ServerClock.timestampOf(msg));
    let call: ResolvedCall;
    try {
      call = ResolvedCallSchema.parse(decodeJson(msg.data));
    } catch (err) {
      // Only a foreign publisher can put this here; nobody can be answered. Kept for people.
      log.error(
        { err, tool: tool.definition.name, seq: msg.seq },
        "work message is not a resolved call",
      );
      await publishDeadLetter(tool, msg, "not a resolved call").then(
        () => msg.ack(),
        () => msg.nak(1_000),
      );
      return;
    }
    const attempt = msg.info.deliveryCount;
    const callLog = log.child({
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
        const inHandKey = callKey(call.address, call.idempotency_key);
        // A restart of the server can lose this process's heartbeats, and the server then
        // delivers a call again while it still runs or its outcome is being recorded here:
        // wait for that, then read the record, instead of running the call twice.
        for (let earlier = inHand.get(inHandKey); earlier !== undefined;) {
          await earlier;
          earlier = inHand.get(inHandKey);
        }
        let handled = (): void => undefined;
        inHand.set(
          inHandKey,
          new Promise<void>((resolve) => {
            handled = resolve;
          }),
        );
        try {
          const stored = await store.get(call);
          if (stored?.record.state === "done" && stored.record.result !== undefined) {
            // Ended already (result, cancellation or deadline): don't run it. Its answer is
            // published again only if the sessions stream lacks it.
            await plane.finalize(call, stored.record.result);
            msg.ack();
            callLog.info("call already ended; answered from its stored result");
            return;
          }
          const started = performance.now();
          const outcome = await telemetry.execute(
            tool.definition,
            call,
            attempt,
            attempt === 1 ? (clock.now() - call.resolved_at) / 1000 : undefined,
            () => runAttempt(tool, call, attempt, callLog),
          );
          const durationMs = Math.round((performance.now() - started) * 1000) / 1000;
          const code = outcome.ok ? undefined : outcome.error.code;
          if (!outcome.ok && outcome.error.details?.[ShutdownCode] === true) {
            telemetry.attemptEnded(call, code, true);
            msg.nak(); // handed back: another executor takes it
            callLog.info("executor shutting down; call handed back");
            return;
          }
          if (!outcome.ok) {
            const delay = retryDelay(
              outcome.error,
              attempt,
              tool.definition,
              call.deadline_at,
              clock.now(),
            );
            if (delay !== undefined) {
              telemetry.attemptEnded(call, code, true);
              callLog.warn(
                {
                  code: outcome.error.code,
                  err: outcome.error,
                  retry_in_ms: delay,
                  duration_ms: durationMs,
                },
                "attempt failed; retrying",
              );
              msg.nak(delay);
              return;
            }
          }
          const target = {
            tool_call_id: call.tool_call_id,
            name: call.tool,
            session_id: call.session_id,
          };
          const extra = { attempts: attempt, duration_ms: durationMs };
          let message: ToolMessage = outcome.ok
            ? { role: "tool", ...target, content: outcome.content, ...extra }
            : errorToolMessage(target, outcome.error, extra);
          const bytes = encodeJson(message).length;
          if (bytes > maxResultBytes) {
            message = errorToolMessage(
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
          }
          telemetry.attemptEnded(call, code, false);
          const { won, retried } = await recordOutcome(call, message, stored, callLog);
          msg.ack();
          if (won)
            telemetry.callEnded(call, message.error?.code, (clock.now() - call.resolved_at) / 1000);
          if (!won && retried) callLog.info("call ended; its outcome was recorded after retrying");
          else if (!won)
            callLog.info("call had already ended (cancelled or past its deadline); result dropped");
          else if (outcome.ok)
            callLog.info(
              {
                args: call.arguments,
                duration_ms: durationMs,
                result_chars: message.content.length,
              },
              "call succeeded",
            );
          else
            callLog.info(
              {
                args: call.arguments,
                duration_ms: durationMs,
                code: outcome.error.code,
                err: outcome.error,
              },
              "call failed",
            );
        } catch (err) {
          callLog.error(
            { err },
            "cannot record or publish the outcome; the call will be redelivered",
          );
          msg.nak(1_000);
        } finally {
          inHand.delete(inHandKey);
          handled();
        }
      },
    );
  }

  /**
   * Ends the call with the outcome of a finished attempt. While the server is unreachable (a
   * restart) it tries again, with backoff, until the call's deadline and one ack wait have
   * passed: giving up would throw the finished work away and run the call again.
   */
  async function recordOutcome(
    call: ResolvedCall,
    message: ToolMessage,
    stored: Awaited<ReturnType<typeof store.get>>,
    callLog: Logger,
  ): Promise<{ won: boolean; retried: boolean }> {
    let known = stored;
    let retried = false;
    const won = await pRetry(
      async () => {
        try {
          return await plane.finalize(call, message, known);
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
        maxRetryTime: Math.max(0, call.deadline_at - clock.now()) + ackWaitMs,
        signal: shutdown.signal,
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

  async function publishDeadLetter(tool: ServedTool, msg: JsMsg, reason: string): Promise<void> {
    const h = deadLetterHeaders({
      stream: subjects.streams.work,
      subject: msg.subject,
      seq: msg.seq,
      reason,
      deliveries: msg.info.deliveryCount,
      headers: msg.headers,
    });
    await js.publish(subjects.dlq(tool.definition.name), msg.data, {
      headers: h,
      msgID: `dlq:${subjects.streams.work}:${msg.seq}`,
    });
  }

  async function runAttempt(
    tool: ServedTool,
    call: ResolvedCall,
    attempt: number,
    callLog: Logger,
  ): Promise<{ ok: true; content: string } | { ok: false; error: ToolmeshError }> {
    const remaining = call.deadline_at - clock.now();
    if (remaining <= 0) {
      return { ok: false, error: deadlineError(call) };
    }
    // The caller may lower the tool's attempt timeout, never raise it.
    const attemptTimeoutMs = Math.min(
      tool.definition.timeout_ms,
      call.attempt_timeout_ms ?? Infinity,
    );
    const timeoutMs = Math.min(attemptTimeoutMs, remaining);
    const controller = new AbortController();
    const key = callKey(call.address, call.idempotency_key);
    running.set(key, controller);
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
    let seq = 0;
    const ctx: ToolContext = {
      callId: call.call_id,
      idempotencyKey: scopedIdempotencyKey(call.address, call.idempotency_key),
      sessionId: call.session_id,
      tool: call.tool,
      attempt,
      context: { ...toolkitContext, ...call.agent_context, ...call.context },
      signal: controller.signal,
      deadlineAt: call.deadline_at + clock.offsetMs,
      log: callLog,
      emit(data) {
        if (!tool.definition.progress) {
          if (seq++ === 0) callLog.warn("tool emitted progress without declaring it; dropped");
          return;
        }
        if (controller.signal.aborted) return;
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
          publishEphemeral(nc, subjects.progress(call.address, call.call_id), event);
        } catch (err) {
          callLog.warn({ err }, "cannot publish progress");
        }
      },
    };
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
      running.delete(key);
      if (!controller.signal.aborted) {
        controller.abort(ATTEMPT_FINISHED);
      }
    }
  }

  return {
    get tools() {
      return [...served.keys()];
    },
    async addTool(module) {
      return serve(module);
    },
    inFlight: () => [...running.keys()],
    async removeTool(name, graceMs: number = Defaults.shutdownGraceMs) {
      const loop = loops.get(name);
      loops.delete(name);
      if (served.delete(name)) metrics.toolServed(name, -1);
      await loop?.stop(graceMs);
      await registry.unregister(name, owner).catch((err: unknown) => {
        log.warn({ err, tool: name }, "cannot remove the tool from the registry");
      });
    },
    async stop(graceMs: number = Defaults.shutdownGraceMs) {
      const handBack = (): void => {
        shutdown.abort(new ToolmeshError(ErrorCode.Unavailable, "executor shutting down"));
        for (const controller of running.values()) {
          controller.abort(
            new ToolmeshError(ErrorCode.Unavailable, "executor shutting down", {
              details: { [ShutdownCode]: true },
            }),
          );
        }
      };
      await Promise.all([...loops.values()].map((loop) => loop.stop(graceMs, handBack)));
      aborts.unsubscribe();
      stopObservingQueues();
      for (const name of served.keys()) metrics.toolServed(name, -1);
    },
  };
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

/** The tool's durable work consumer, shared by every executor serving it. */
function ensureWorkConsumer(
  jsm: JetStreamManager,
  subjects: Subjects,
  definition: ToolDefinition,
  ackWaitMs: number,
): Promise<unknown> {
  return ensureDurableConsumer(jsm, {
    stream: subjects.streams.work,
    name: subjects.workConsumer(definition.name),
    filterSubject: subjects.work(definition.name),
    ackWaitMs,
    // Crash redeliveries count as deliveries too: leave room beyond the policy's attempts.
    maxDeliver: definition.retry.max_attempts + 3,
    maxAckPending: 1_000,
  });
}
