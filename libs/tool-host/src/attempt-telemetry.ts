import type { ResolvedCall, ToolDefinition, ToolmeshError } from "@toolmesh/protocol";
import type { Link, SpanContext, Tracer } from "@toolmesh/telemetry";
import {
  ATTR_GEN_AI_OPERATION_NAME,
  ATTR_GEN_AI_TOOL_CALL_ARGUMENTS,
  ATTR_GEN_AI_TOOL_CALL_ID,
  ATTR_GEN_AI_TOOL_CALL_RESULT,
  ATTR_GEN_AI_TOOL_NAME,
  ATTR_GEN_AI_TOOL_TYPE,
  ATTR_TOOLMESH_ATTEMPT,
  GEN_AI_OPERATION_EXECUTE_TOOL,
  SpanKind,
  markOutcome,
  payloadRecording,
  redactPayload,
  withSpan,
} from "@toolmesh/telemetry";
import type { ToolmeshMetrics } from "@toolmesh/telemetry";
import type { AuditTrail } from "@toolmesh/audit";
import { AttemptEvents } from "./attempt-events.js";

/** How one attempt ended, as the executor sees it. */
export type AttemptOutcome = { ok: true; content: string } | { ok: false; error: ToolmeshError };

// How many calls' last attempt spans are remembered, to link a retry to the attempt before it.
const REMEMBERED_ATTEMPTS = 4_096;

/**
 * The executor's traces and metrics of attempts, kept out of its handler: each attempt runs in
 * an `execute_tool {tool}` span (GenAI conventions) and counts in the tool's metrics, and a
 * retry's span is linked to the attempt before it when this process ran that one.
 */
export class AttemptTelemetry {
  readonly #tracer: Tracer;
  readonly #metrics: ToolmeshMetrics;
  readonly #lastAttempt = new Map<string, SpanContext>();

  readonly #audit: Pick<AuditTrail, "record"> | undefined;
  // Each delivery's attempt events until it is settled, by the delivery's call.
  readonly #events = new WeakMap<ResolvedCall, AttemptEvents>();

  /**
   * `audit`: where each attempt's start and end are recorded (ADR 0060, {@link AttemptEvents});
   * none when undefined.
   */
  constructor(tracer: Tracer, metrics: ToolmeshMetrics, audit?: Pick<AuditTrail, "record">) {
    this.#tracer = tracer;
    this.#metrics = metrics;
    this.#audit = audit;
  }

  /** Links of a delivery's span: the previous attempt of the same call, when known here. */
  linksFor(call: ResolvedCall, attempt: number): Link[] | undefined {
    if (attempt <= 1) return undefined;
    const previous = this.#lastAttempt.get(call.idempotency_key);
    return previous === undefined ? undefined : [{ context: previous }];
  }

  /** Remembers the span of this delivery, for the next attempt's link. */
  remember(call: ResolvedCall, spanContext: SpanContext | undefined): void {
    if (spanContext === undefined) return;
    this.#lastAttempt.delete(call.idempotency_key);
    this.#lastAttempt.set(call.idempotency_key, spanContext);
    if (this.#lastAttempt.size > REMEMBERED_ATTEMPTS) {
      this.#lastAttempt.delete(this.#lastAttempt.keys().next().value as string);
    }
  }

  /** Runs one attempt in its `execute_tool` span; `queueWaitS` for a call's first attempt. */
  async execute(
    definition: ToolDefinition,
    call: ResolvedCall,
    attempt: number,
    queueWaitS: number | undefined,
    run: () => Promise<AttemptOutcome>,
  ): Promise<AttemptOutcome> {
    this.#metrics.attemptStarted(call.tool, queueWaitS);
    const recordPayloads = payloadRecording();
    return withSpan(
      this.#tracer,
      `${GEN_AI_OPERATION_EXECUTE_TOOL} ${call.tool}`,
      {
        kind: SpanKind.INTERNAL,
        attributes: {
          [ATTR_GEN_AI_OPERATION_NAME]: GEN_AI_OPERATION_EXECUTE_TOOL,
          [ATTR_GEN_AI_TOOL_NAME]: call.tool,
          [ATTR_GEN_AI_TOOL_CALL_ID]: call.tool_call_id,
          [ATTR_GEN_AI_TOOL_TYPE]: definition.kind === "builtin" ? "function" : "extension",
          [ATTR_TOOLMESH_ATTEMPT]: attempt,
          ...(recordPayloads
            ? { [ATTR_GEN_AI_TOOL_CALL_ARGUMENTS]: redactPayload(call.arguments) }
            : {}),
        },
      },
      async (span) => {
        const started = Date.now();
        const events = this.#audit && new AttemptEvents(this.#audit, call, attempt);
        if (events !== undefined) this.#events.set(call, events);
        const outcome = await run();
        events?.ended({
          attempt,
          duration_ms: Date.now() - started,
          outcome: outcome.ok ? "ok" : outcome.error.code,
        });
        if (outcome.ok) {
          if (recordPayloads)
            span.setAttribute(ATTR_GEN_AI_TOOL_CALL_RESULT, redactPayload(outcome.content));
        } else markOutcome(span, outcome.error.code, outcome.error.message);
        return outcome;
      },
    );
  }

  /** The attempt's outcome is settled: `retried` when another attempt follows. */
  attemptEnded(call: ResolvedCall, code: string | undefined, retried: boolean): void {
    this.#metrics.attemptEnded(call.tool, code, retried);
    if (!retried) this.#lastAttempt.delete(call.idempotency_key);
  }

  /** The call ended with this executor's final message, `durationS` after its acceptance. */
  callEnded(call: ResolvedCall, code: string | undefined, durationS: number): void {
    this.#metrics.callEnded(call.tool, code, durationS);
    this.#events.get(call)?.endedTheCall();
  }

  /** The delivery of `call` is settled, whatever became of it: its attempt events are written. */
  deliverySettled(call: ResolvedCall): void {
    this.#events.get(call)?.settle();
    this.#events.delete(call);
  }
}
