import type { NatsConnection } from "@nats-io/nats-core";
import { nanos } from "@nats-io/nats-core";
import type { ConsumerConfig, JetStreamManager, JsMsg } from "@nats-io/jetstream";
import { AckPolicy, DeliverPolicy, JetStreamApiError, jetstream } from "@nats-io/jetstream";
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
  ToolDefinitionSchema,
  ToolmeshError,
  decodeJson,
  ensureError,
  summarize,
} from "@toolmesh/protocol";
import type { StreamLimits, WorkLoop } from "@toolmesh/nats";
import {
  Semaphore,
  ensureStreams,
  publishDurable,
  publishEphemeral,
  startWorkLoop,
} from "@toolmesh/nats";
import type { ToolRegistry } from "@toolmesh/registry";
import type { Logger, Tracer } from "@toolmesh/telemetry";
import {
  ATTR_MESSAGING_DESTINATION_NAME,
  ATTR_MESSAGING_OPERATION_TYPE,
  ATTR_MESSAGING_SYSTEM,
  ATTR_TOOLMESH_ATTEMPT,
  ATTR_TOOLMESH_CALL_ID,
  ATTR_TOOLMESH_SESSION_ID,
  ATTR_TOOLMESH_TOOL,
  MESSAGING_SYSTEM_VALUE_NATS,
  SpanKind,
  extractTraceContext,
  withSpan,
} from "@toolmesh/telemetry";
import type { ToolContext, ToolModule } from "./tool-module.js";

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
  /** Extra time a message stays owned beyond the attempt timeout, in ms. Default 15 000. */
  ackGraceMs?: number;
}

/** A running executor. */
export interface Executor {
  /** Names of the tools this executor serves (registration conflicts excluded). */
  readonly tools: readonly string[];
  /** Stops pulling work and waits for running calls (at most `graceMs`, default 10 s). */
  stop(graceMs?: number): Promise<void>;
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
    kind: "builtin",
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

/**
 * Registers the tools and consumes their work. Each tool has one durable pull consumer on
 * the work stream shared by every executor serving it, so N processes split the work.
 */
export async function startExecutor(options: ExecutorOptions): Promise<Executor> {
  const { nc, subjects, registry, log, tracer } = options;
  const owner = options.owner ?? "executor";
  const ackGraceMs = options.ackGraceMs ?? 15_000;
  const jsm = await ensureStreams(nc, subjects, options.streamLimits);
  const js = jetstream(nc);
  const slots = new Semaphore(options.concurrency ?? 16);
  const toolkitContext = options.toolkitContext ?? {};
  const served: ServedTool[] = [];

  for (const module of options.tools) {
    const definition = toolDefinitionOf(module, owner);
    const outcome = await registry.register(definition);
    if (outcome.status === "conflict") continue; // the registry has logged the warning
    served.push({
      module,
      definition,
      presets: { ...module.presets, ...options.presets?.[module.name] },
    });
  }

  const loops: WorkLoop[] = [];
  for (const tool of served) {
    await ensureWorkConsumer(jsm, subjects, tool.definition, ackGraceMs);
    loops.push(
      await startWorkLoop({
        js,
        stream: subjects.streams.work,
        consumer: subjects.workConsumer(tool.definition.name),
        slots,
        maxMessages: 2,
        handle: (msg) => handleWork(tool, msg),
        onError: (err) => log.error({ err, tool: tool.definition.name }, "work loop error"),
      }),
    );
  }
  log.info({ tools: served.map((t) => t.definition.name), owner }, "executor started");

  async function handleWork(tool: ServedTool, msg: JsMsg): Promise<void> {
    let call: ResolvedCall;
    try {
      call = ResolvedCallSchema.parse(decodeJson(msg.data));
    } catch (err) {
      // Only a foreign publisher can put this here; nobody can be answered.
      log.error(
        { err, tool: tool.definition.name, seq: msg.seq },
        "dropping work message that is not a resolved call",
      );
      msg.term();
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
        kind: SpanKind.CONSUMER,
        parent: extractTraceContext(msg.headers),
        attributes: {
          [ATTR_MESSAGING_SYSTEM]: MESSAGING_SYSTEM_VALUE_NATS,
          [ATTR_MESSAGING_OPERATION_TYPE]: "process",
          [ATTR_MESSAGING_DESTINATION_NAME]: msg.subject,
          [ATTR_TOOLMESH_CALL_ID]: call.call_id,
          [ATTR_TOOLMESH_SESSION_ID]: call.session_id,
          [ATTR_TOOLMESH_TOOL]: call.tool,
          [ATTR_TOOLMESH_ATTEMPT]: attempt,
        },
      },
      async () => {
        const started = performance.now();
        const outcome = await runAttempt(tool, call, attempt, callLog);
        const durationMs = Math.round((performance.now() - started) * 1000) / 1000;
        if (!outcome.ok) {
          const delay = retryDelay(outcome.error, attempt, tool.definition, call.deadline_at);
          if (delay !== undefined) {
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
        const message: ToolMessage = {
          role: "tool",
          tool_call_id: call.tool_call_id,
          name: call.tool,
          content: outcome.ok ? outcome.content : `Error: ${outcome.error.message}`,
          session_id: call.session_id,
          attempts: attempt,
          duration_ms: durationMs,
          ...(outcome.ok ? {} : { error: outcome.error.toWire() }),
        };
        try {
          await publishDurable(js, subjects.result(call.address, call.call_id), message, {
            msgId: `result:${call.idempotency_key}`,
          });
        } catch (err) {
          callLog.error({ err }, "cannot publish the result; the call will be redelivered");
          msg.nak(1_000);
          return;
        }
        msg.ack();
        if (outcome.ok) {
          callLog.info(
            { args: call.arguments, duration_ms: durationMs, result_chars: message.content.length },
            "call succeeded",
          );
        } else {
          callLog.info(
            {
              args: call.arguments,
              duration_ms: durationMs,
              code: outcome.error.code,
              err: outcome.error,
            },
            "call failed",
          );
        }
      },
    );
  }

  async function runAttempt(
    tool: ServedTool,
    call: ResolvedCall,
    attempt: number,
    callLog: Logger,
  ): Promise<{ ok: true; content: string } | { ok: false; error: ToolmeshError }> {
    const remaining = call.deadline_at - Date.now();
    if (remaining <= 0) {
      return { ok: false, error: deadlineError(call) };
    }
    const timeoutMs = Math.min(tool.definition.timeout_ms, remaining);
    const controller = new AbortController();
    const timer = setTimeout(() => {
      controller.abort(
        timeoutMs < tool.definition.timeout_ms
          ? deadlineError(call)
          : new ToolmeshError(
              ErrorCode.Timeout,
              `attempt ${attempt} of "${call.tool}" timed out after ${timeoutMs} ms`,
              {
                details: { timeout_ms: timeoutMs, attempt },
              },
            ),
      );
    }, timeoutMs);
    let seq = 0;
    const ctx: ToolContext = {
      callId: call.call_id,
      idempotencyKey: call.idempotency_key,
      sessionId: call.session_id,
      tool: call.tool,
      attempt,
      context: { ...toolkitContext, ...call.agent_context, ...call.context },
      signal: controller.signal,
      deadlineAt: call.deadline_at,
      log: callLog,
      emit(data) {
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
      if (!controller.signal.aborted)
        controller.abort(new ToolmeshError(ErrorCode.Cancelled, "attempt finished"));
    }
  }

  return {
    tools: served.map((t) => t.definition.name),
    async stop(graceMs = 10_000) {
      await Promise.all(loops.map((loop) => loop.stop(graceMs)));
    },
  };
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
  };
  const code =
    typeof shape.code === "string" && WIRE_CODES.has(shape.code)
      ? (shape.code as ErrorCode)
      : ErrorCode.ToolError;
  const details =
    typeof shape.details === "object" && shape.details !== null
      ? (shape.details as Record<string, unknown>)
      : undefined;
  return new ToolmeshError(code, err instanceof Error ? err.message : String(err), {
    retryable: typeof shape.retryable === "boolean" ? shape.retryable : true,
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
  try {
    return JSON.stringify(value);
  } catch (err) {
    throw new ToolmeshError(ErrorCode.ToolError, "the tool's result cannot be converted to JSON", {
      retryable: false,
      cause: err,
    });
  }
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

const CONSUMER_NOT_FOUND = 10014;

/** Creates the tool's durable work consumer, or updates it to the tool's current policy. */
async function ensureWorkConsumer(
  jsm: JetStreamManager,
  subjects: Subjects,
  definition: ToolDefinition,
  ackGraceMs: number,
): Promise<void> {
  const name = subjects.workConsumer(definition.name);
  const config: Partial<ConsumerConfig> = {
    durable_name: name,
    filter_subject: subjects.work(definition.name),
    ack_policy: AckPolicy.Explicit,
    deliver_policy: DeliverPolicy.All,
    ack_wait: nanos(definition.timeout_ms + ackGraceMs),
    // Crash redeliveries count as deliveries too: leave room beyond the policy's attempts.
    max_deliver: definition.retry.max_attempts + 3,
    max_ack_pending: 1_000,
  };
  const exists = await jsm.consumers.info(subjects.streams.work, name).then(
    () => true,
    (err: unknown) => {
      if (err instanceof JetStreamApiError && err.code === CONSUMER_NOT_FOUND) return false;
      throw err;
    },
  );
  if (exists) {
    await jsm.consumers.update(subjects.streams.work, name, {
      ack_wait: config.ack_wait,
      max_deliver: config.max_deliver,
      max_ack_pending: config.max_ack_pending,
    });
  } else {
    await jsm.consumers.add(subjects.streams.work, config);
  }
}
