import type { Msg, NatsConnection, Subscription } from "@nats-io/nats-core";
import type { JsMsg } from "@nats-io/jetstream";
import type { z } from "zod";
import type {
  CallRequest,
  MissingArgumentsEvent,
  Rejection,
  ResolveReply,
  ResolvedCall,
  SessionAddress,
  Subjects,
  ToolDefinition,
} from "@toolmesh/protocol";
import {
  CallRequestSchema,
  Defaults,
  ErrorCode,
  ToolmeshError,
  callKey,
  contextDepthError,
  decodeJson,
  encodeJson,
  ensureError,
  errorToolMessage,
  subjectToken,
  idempotencyKeyOf,
} from "@toolmesh/protocol";
import type { StreamLimits, WorkLoop } from "@toolmesh/nats";
import {
  Semaphore,
  ServerClock,
  ensureConsumer,
  meshPlan,
  publishDurable,
  startWorkLoop,
} from "@toolmesh/nats";
import { ANY_ARGUMENTS, argumentsHash, openCallPlane } from "@toolmesh/call-store";
import type { AcceptOutcome } from "@toolmesh/call-store";
import type { ToolRegistry } from "@toolmesh/registry";
import type { Logger, Tracer } from "@toolmesh/telemetry";
import {
  ATTR_TOOLMESH_CALL_ID,
  ATTR_TOOLMESH_SESSION_ID,
  ATTR_TOOLMESH_TOOL,
  markOutcome,
  processSpanOptions,
  toolmeshMetrics,
  withSpan,
} from "@toolmesh/telemetry";
import { deadlineHeaders, startControlPlane } from "@toolmesh/control-plane";
import type { ControlPlane } from "@toolmesh/control-plane";
import { findCloseMatches, parseArguments, resolveCall, validateToolName } from "./resolve-call.js";
import { SessionLimits } from "./session-limits.js";

/** Options of {@link startResolver}. Durations in ms. */
export interface ResolverOptions {
  nc: NatsConnection;
  subjects: Subjects;
  registry: ToolRegistry;
  log: Logger;
  tracer: Tracer;
  /** Budget of a call that sets none, in ms. Default 60 000. */
  defaultTimeoutMs?: number;
  /**
   * How long a delivered call stays owned without a sign of life, in ms: after a resolver
   * crash its calls are redelivered once this passes. Default 10 000.
   */
  ackWaitMs?: number;
  /** Calls resolved at once by this process. Default 64. */
  concurrency?: number;
  /** Calls of one session in flight through this resolver; more get `overloaded`. Default 256. */
  sessionMaxInFlight?: number;
  streamLimits?: StreamLimits;
  /** How long call records are kept (the idempotency horizon), in ms. Default 24 h. */
  callRetentionMs?: number;
  /** Who may call what: tool groups and agents. Default: every tool open to every session. */
  access?: ToolAccessPolicy;
}

/**
 * Decides whether a session may call a tool (an `AccessView` from `@toolmesh/catalog` fits).
 * Runs on every call: it must answer from memory.
 */
export interface ToolAccessPolicy {
  /** The error the call gets (`permission_denied`, `tool_disabled`), or `undefined` to go on. */
  check(def: ToolDefinition, at: SessionAddress, agent?: string): ToolmeshError | undefined;
}

/** A running resolver. */
export interface Resolver {
  /** Stops taking calls and waits for those in hand (at most `graceMs`, default 10 s). */
  stop(graceMs?: number): Promise<void>;
}

/** The outcome of resolving one submitted call. */
export type Resolution =
  | { ok: true; resolved: ResolvedCall; request: CallRequest }
  | {
      ok: false;
      error: ToolmeshError;
      toolCallId: string | undefined;
      tool: string | undefined;
      request: CallRequest | undefined;
    };

/**
 * Resolves one call request against the registry: envelope, tool name, access (agent and tool
 * groups, when `access` is given), arguments, defaults, missing params and schema validation.
 * Access comes before the arguments, so a tool the session may not call never reveals its
 * schema through `missing_arguments`. `now` is the server-clock time the call was accepted:
 * its deadline counts from there.
 */
export function resolveRequest(
  registry: ToolRegistry,
  body: unknown,
  address: SessionAddress,
  options: { now: number; defaultTimeoutMs: number; access?: ToolAccessPolicy | undefined },
): Resolution {
  const envelope = CallRequestSchema.safeParse(body);
  if (!envelope.success) {
    return { ok: false, error: envelopeError(envelope.error), ...partialIds(body) };
  }
  const request = envelope.data;
  const toolCallId = request.tool_call.id;
  const name = request.tool_call.function.name;
  try {
    const tooDeep = contextDepthError(request);
    if (tooDeep !== undefined) throw tooDeep;
    if (subjectToken(request.session_id) !== address.session) {
      throw new ToolmeshError(
        ErrorCode.InvalidRequest,
        "session_id does not match the session of the subject it was published on",
        { details: { session_id: request.session_id } },
      );
    }
    validateToolName(name);
    const { access } = options;
    const tool = registry.get(name);
    if (tool === undefined) {
      // Only tools the session may call are suggested.
      const callable =
        access === undefined
          ? registry.names()
          : [...registry.tools()]
              .filter((t) => access.check(t.definition, address, request.agent) === undefined)
              .map((t) => t.definition.name);
      const closeMatches = findCloseMatches(name, callable);
      throw new ToolmeshError(
        ErrorCode.UnknownTool,
        closeMatches.length > 0
          ? `unknown tool "${name}"; did you mean ${closeMatches.map((m) => `"${m}"`).join(", ")}?`
          : `unknown tool "${name}"`,
        { details: { tool: name, close_matches: closeMatches } },
      );
    }
    const denied = access?.check(tool.definition, address, request.agent);
    if (denied !== undefined) throw denied;
    const args = parseArguments(request.tool_call.function.arguments);
    const resolved = resolveCall(tool, request, args, {
      now: options.now,
      defaultTimeoutMs: options.defaultTimeoutMs,
      address,
    });
    return { ok: true, resolved, request };
  } catch (err) {
    return { ok: false, error: ensureError(err), toolCallId, tool: name, request };
  }
}

function envelopeError(error: z.ZodError): ToolmeshError {
  const issues = error.issues.map((i) => ({ path: `/${i.path.join("/")}`, message: i.message }));
  if (error.issues.every((i) => i.path.join(".") === "tool_call.function.arguments")) {
    return new ToolmeshError(
      ErrorCode.InvalidArguments,
      "function.arguments must be a JSON object or a string holding one",
      { details: { issues } },
    );
  }
  return new ToolmeshError(
    ErrorCode.InvalidRequest,
    `malformed call request: ${issues.map((i) => `${i.path} ${i.message}`).join("; ")}`,
    { details: { issues } },
  );
}

function partialIds(body: unknown): {
  toolCallId: string | undefined;
  tool: string | undefined;
  request: undefined;
} {
  const call = (body as { tool_call?: { id?: unknown; function?: { name?: unknown } } } | null)
    ?.tool_call;
  const id = call?.id;
  const name = call?.function?.name;
  return {
    toolCallId: typeof id === "string" && id.length > 0 && id.length <= 256 ? id : undefined,
    tool: typeof name === "string" && name.length <= 256 ? name : undefined,
    request: undefined,
  };
}

function bodyError(err: unknown): ToolmeshError {
  if (err instanceof TypeError) {
    return new ToolmeshError(ErrorCode.InvalidRequest, "call request is not valid UTF-8", {
      cause: err,
    });
  }
  return new ToolmeshError(
    ErrorCode.InvalidRequest,
    `call request is not JSON: ${(err as Error).message}`,
    { cause: err },
  );
}

/**
 * Takes calls from the calls stream, resolves them, answers invalid ones on their session at
 * once and routes valid ones to their tool's work subject, after recording them in the call
 * store and arming their deadline. Also runs the control plane: deadline keeper, dead-letter
 * keeper, cancellation, dry-run requests.
 */
export async function startResolver(options: ResolverOptions): Promise<Resolver> {
  const { nc, subjects, registry, log, tracer } = options;
  const defaultTimeoutMs = options.defaultTimeoutMs ?? Defaults.callTimeoutMs;
  const ackWaitMs = options.ackWaitMs ?? Defaults.ackWaitMs;
  const callRetentionMs = options.callRetentionMs ?? Defaults.callRetentionMs;
  const plane = await openCallPlane(nc, {
    subjects,
    streamLimits: options.streamLimits,
    callRetentionMs: options.callRetentionMs,
  });
  const { jsm, js, store, clock, publishFinal } = plane;
  const limits = new SessionLimits(options.sessionMaxInFlight ?? 256);
  const metrics = toolmeshMetrics();
  await ensureResolverConsumer();

  const control: ControlPlane = await startControlPlane({ nc, plane, subjects, log });

  void (async () => {
    for await (const status of nc.status()) if (status.type === "reconnect") limits.clear();
  })();
  const results: Subscription = nc.subscribe(subjects.allResults, {
    callback: (err, msg) => {
      const settled = err === null ? subjects.parseResultSubject(msg.subject) : undefined;
      if (settled !== undefined) limits.settled(settled.address, settled.call);
    },
  });

  const loop: WorkLoop = await startWorkLoop({
    js,
    stream: subjects.streams.calls,
    consumer: subjects.resolverConsumer,
    slots: new Semaphore(options.concurrency ?? 64),
    maxMessages: 32,
    // Calls wait in the buffer for a slot: keep them owned so a live resolver keeps them.
    heartbeatMs: Math.max(250, Math.floor(ackWaitMs / 3)),
    handle: handleCall,
    onError: (err) => log.error({ err }, "resolver loop error"),
  });

  const rpc: Subscription = nc.subscribe(subjects.allResolveRpc, {
    queue: "toolmesh-resolver",
    callback: (err, msg) => {
      if (err !== null) {
        log.error({ err }, "resolve subscription failed");
        return;
      }
      answerDryRun(msg);
    },
  });
  const stopWatching = registry.onChange(({ name, tool }) => {
    if (tool === undefined) log.info({ tool: name }, "tool removed");
    else
      log.info(
        { tool: name, revision: tool.revision, owner: tool.definition.owner },
        "tool available",
      );
  });
  log.info({ prefix: subjects.prefix, tools: [...registry.names()] }, "resolver started");

  async function ensureResolverConsumer(): Promise<void> {
    await ensureConsumer(jsm, meshPlan(subjects, { ackWaitMs }).consumers.resolver);
  }

  function answerDryRun(msg: Msg): void {
    let reply: ResolveReply;
    const tenant = subjects.parseRpcTenant(msg.subject);
    if (tenant === undefined) {
      const error = new ToolmeshError(
        ErrorCode.InvalidRequest,
        `request subject "${msg.subject}" holds a tenant token no tenant id maps to`,
        { details: { subject: msg.subject } },
      );
      msg.respond(encodeJson({ ok: false, error: error.toWire() } satisfies ResolveReply));
      return;
    }
    try {
      const body = decodeJson(msg.data) as { session_id?: unknown } | null;
      const sessionId = body?.session_id;
      const session =
        typeof sessionId === "string" && sessionId.length > 0 ? subjectToken(sessionId) : "_";
      const resolution = resolveRequest(
        registry,
        body,
        { tenant, session },
        { now: clock.now(), defaultTimeoutMs, access: options.access },
      );
      reply = resolution.ok
        ? { ok: true, resolved: resolution.resolved }
        : { ok: false, error: resolution.error.toWire() };
    } catch (err) {
      reply = { ok: false, error: bodyError(err).toWire() };
    }
    msg.respond(encodeJson(reply));
  }

  async function handleCall(msg: JsMsg): Promise<void> {
    const address = subjects.parseSessionSubject(msg.subject);
    if (address === undefined) {
      // No answer can be addressed: a token such as a literal `*` would make the session
      // subject a wildcard. The letter keeps the message for operators.
      log.error(
        { subject: msg.subject },
        "call on a subject outside the call layout (or with a token no id maps to); dead-lettered",
      );
      await control.deadLetter(subjects.streams.calls, msg.seq, "not a call subject");
      msg.ack();
      return;
    }
    const acceptedAt = ServerClock.timestampOf(msg);
    clock.observe(acceptedAt);
    await withSpan(
      tracer,
      "resolve",
      processSpanOptions(msg, { [ATTR_TOOLMESH_SESSION_ID]: address.session }),
      async (span) => {
        let resolution: Resolution;
        try {
          resolution = resolveRequest(registry, decodeJson(msg.data), address, {
            now: acceptedAt,
            defaultTimeoutMs,
            access: options.access,
          });
        } catch (err) {
          resolution = {
            ok: false,
            error: bodyError(err),
            toolCallId: undefined,
            tool: undefined,
            request: undefined,
          };
        }
        const callId = resolution.ok ? resolution.resolved.call_id : resolution.toolCallId;
        const tool = resolution.ok ? resolution.resolved.tool : resolution.tool;
        if (callId !== undefined) span.setAttribute(ATTR_TOOLMESH_CALL_ID, callId);
        if (tool !== undefined) span.setAttribute(ATTR_TOOLMESH_TOOL, tool);
        // Only a registered tool's name becomes a label: the model can make names up.
        metrics.resolved(
          resolution.ok ? undefined : resolution.error.code,
          tool !== undefined && registry.get(tool) !== undefined ? tool : undefined,
        );
        if (!resolution.ok) markOutcome(span, resolution.error.code, resolution.error.message);
        const callLog = log.child({ callId, sessionId: address.session, tool });
        try {
          if (resolution.ok) await routeCall(resolution, msg, callLog);
          else if (await answerKnownKey(resolution, address, msg.seq, callLog)) {
            callLog.info({ code: resolution.error.code }, "refused resubmission of a known call");
          } else {
            await answerInvalid(resolution, address, msg.seq);
            callLog.info({ code: resolution.error.code, err: resolution.error }, "call rejected");
          }
          msg.ack();
        } catch (err) {
          callLog.error(
            { err: ensureError(err) },
            "cannot hand the call on; it will be redelivered",
          );
          msg.nak(Math.min(1_000 * 2 ** (msg.info.deliveryCount - 1), 10_000));
        }
      },
    );
  }

  async function routeCall(
    resolution: Extract<Resolution, { ok: true }>,
    msg: JsMsg,
    callLog: Logger,
  ): Promise<void> {
    const { resolved, request } = resolution;
    const key = callKey(resolved.address, resolved.idempotency_key);
    const target = {
      tool_call_id: resolved.call_id,
      name: resolved.tool,
      session_id: resolved.session_id,
    };
    const publishAnswer = (error: ToolmeshError, msgId: string): Promise<unknown> =>
      publishFinal(
        subjects.result(resolved.address, resolved.call_id),
        errorToolMessage(target, error, { attempts: 0 }),
        msgId,
      );
    // A refusal before acceptance must not take the place of a known call's result either.
    const refuse = async (error: ToolmeshError): Promise<void> => {
      const refused = {
        ok: false as const,
        error,
        toolCallId: resolved.call_id,
        tool: resolved.tool,
        request,
      };
      if (!(await answerKnownKey(refused, resolved.address, msg.seq, callLog)))
        await publishAnswer(error, `result:${key}`);
    };

    if (resolved.timeout_ms > callRetentionMs) {
      // Its record would expire while it runs, and with it the guarantee of one final message.
      await refuse(
        new ToolmeshError(
          ErrorCode.InvalidRequest,
          `timeout_ms ${resolved.timeout_ms} is longer than calls are remembered (${callRetentionMs} ms)`,
          { details: { timeout_ms: resolved.timeout_ms, max_timeout_ms: callRetentionMs } },
        ),
      );
      return;
    }
    if (clock.now() >= resolved.deadline_at) {
      // It waited in the calls stream past its deadline (no resolver was running).
      await refuse(
        new ToolmeshError(
          ErrorCode.DeadlineExceeded,
          `call ${resolved.call_id} passed its deadline before it was resolved`,
          {
            details: { deadline_at: resolved.deadline_at, timeout_ms: resolved.timeout_ms },
          },
        ),
      );
      return;
    }
    if (!limits.tryAcquire(resolved, clock.now())) {
      await publishAnswer(
        new ToolmeshError(
          ErrorCode.Overloaded,
          `session ${resolved.session_id} has too many calls in flight`,
          {
            details: { max_in_flight: limits.max, retry_after_ms: 1_000 },
          },
        ),
        `overloaded:${key}:${msg.seq}`,
      );
      return;
    }
    const accepted = await store.accept({
      idempotency_key: resolved.idempotency_key,
      call_id: resolved.call_id,
      session_id: resolved.session_id,
      address: resolved.address,
      tool: resolved.tool,
      args_hash: argumentsHash(request.tool_call.function.arguments),
      state: "accepted",
      deadline_at: resolved.deadline_at,
    });
    if (accepted.status === "conflict" || accepted.status === "done") {
      limits.release(resolved);
      await answerResubmission(accepted, resolved, request, msg.seq, callLog);
      return;
    }
    if (accepted.status === "in_flight") {
      // Accepted before but maybe never routed: a crash between accepting and routing, or a
      // killed server that forgot the first delivery (it comes back as delivery 1). Route
      // again: the work's message id makes a repeat harmless within the window.
      callLog.info("call accepted before; routing it again");
    }
    try {
      // The headers carry the deadline to every resolver's deadline keeper.
      await publishDurable(js, subjects.work(resolved.tool), resolved, {
        msgId: key,
        headers: deadlineHeaders(resolved),
      });
    } catch (err) {
      const error = ensureError(err);
      if (error.retryable) throw err;
      // The record itself cannot be sent (defaults made it outgrow the limit): answer now.
      await plane.finalize(resolved, errorToolMessage(target, error, { attempts: 0 }));
      return;
    }
    callLog.debug({ missing_optional: resolved.missing_optional }, "call routed to its executors");
  }

  async function answerInvalid(
    resolution: Extract<Resolution, { ok: false }>,
    address: SessionAddress,
    seq: number,
  ): Promise<void> {
    const { error, request } = resolution;
    // Without a usable call id the answer still reaches the session, keyed by stream sequence.
    const callId = resolution.toolCallId ?? `invalid-${seq}`;
    if (error.code === ErrorCode.MissingArguments && request !== undefined) {
      const event: MissingArgumentsEvent = {
        tool_call_id: callId,
        session_id: request.session_id,
        address,
        tool: request.tool_call.function.name,
        tool_revision: registry.get(request.tool_call.function.name)?.revision ?? 0,
        missing_required: (error.details?.missing_required as string[] | undefined) ?? [],
        missing_optional: (error.details?.missing_optional as string[] | undefined) ?? [],
        at: Date.now(),
      };
      await publishDurable(js, subjects.missingArguments(address, event.tool), event, {
        msgId: `missing:${callKey(address, idempotencyKeyOf(request, callId))}`,
      });
    }
    const message = errorToolMessage(
      {
        tool_call_id: callId,
        name: resolution.tool ?? "",
        session_id: request?.session_id ?? address.session,
      },
      error,
      { attempts: 0 },
    );
    await publishFinal(
      subjects.result(address, callId),
      message,
      `result:${callKey(address, request?.idempotency_key ?? `${request?.session_id ?? address.session}/${callId}`)}`,
    );
  }

  /**
   * A refused submission whose key names a call the store knows is a resubmission of that
   * call: answered as one ({@link answerResubmission}) instead of on the call's result subject,
   * where its error would take the place of the call's own final message. False when the key
   * names no call (or the envelope gave no key): answer it as an invalid call.
   */
  async function answerKnownKey(
    resolution: Extract<Resolution, { ok: false }>,
    address: SessionAddress,
    seq: number,
    callLog: Logger,
  ): Promise<boolean> {
    const { request } = resolution;
    if (request === undefined || subjectToken(request.session_id) !== address.session) return false;
    const key = idempotencyKeyOf(request, request.tool_call.id);
    const stored = await store.get({ idempotency_key: key, address });
    if (stored === undefined) return false;
    const { record } = stored;
    const submission = {
      call_id: request.tool_call.id,
      session_id: request.session_id,
      tool: request.tool_call.function.name,
      address,
      idempotency_key: key,
    };
    const argsHash = argumentsHash(request.tool_call.function.arguments);
    const conflicting =
      record.args_hash !== ANY_ARGUMENTS &&
      (record.args_hash !== argsHash || record.tool !== submission.tool);
    if (conflicting) {
      await answerResubmission({ status: "conflict", record }, submission, request, seq, callLog);
    } else if (record.state === "done" && record.result !== undefined) {
      const result = record.result;
      await answerResubmission(
        { status: "done", record: { ...record, result } },
        submission,
        request,
        seq,
        callLog,
      );
    }
    // In flight: the call's own final message answers it.
    return true;
  }

  /**
   * Answers a submission whose key names a call accepted before, without touching that call:
   * a conflicting reuse of the key (other arguments or tool) gets `idempotency_conflict` on its
   * own `rejected.{seq}` subject, never on the call's result subject; a call that ended has its
   * stored final message published again for this submission's call id.
   */
  async function answerResubmission(
    outcome: Extract<AcceptOutcome, { status: "conflict" | "done" }>,
    submission: {
      call_id: string;
      session_id: string;
      tool: string;
      address: SessionAddress;
      idempotency_key: string;
    },
    request: CallRequest,
    seq: number,
    callLog: Logger,
  ): Promise<void> {
    const key = callKey(submission.address, submission.idempotency_key);
    if (outcome.status === "conflict") {
      const error = new ToolmeshError(
        ErrorCode.IdempotencyConflict,
        `idempotency key "${submission.idempotency_key}" was used before with different arguments`,
        {
          details: {
            idempotency_key: submission.idempotency_key,
            tool: outcome.record.tool,
            call_id: outcome.record.call_id,
          },
        },
      );
      const rejection: Rejection = {
        ...errorToolMessage(
          {
            tool_call_id: submission.call_id,
            name: request.tool_call.function.name,
            session_id: submission.session_id,
          },
          error,
          { attempts: 0 },
        ),
        error: error.toWire(),
        seq,
      };
      await publishDurable(js, subjects.rejected(submission.address, seq), rejection, {
        msgId: `rejected:${key}:${seq}`,
      });
      callLog.info({ seq }, "conflicting reuse of an idempotency key refused");
      return;
    }
    // The same key may come back under another call id: answer that id. A call cancelled
    // before it arrived gets its tool's name here.
    await publishFinal(
      subjects.result(submission.address, submission.call_id),
      {
        ...outcome.record.result,
        tool_call_id: submission.call_id,
        session_id: submission.session_id,
        name: submission.tool,
      },
      outcome.record.call_id === submission.call_id
        ? `result:${key}`
        : `result:${key}:${subjectToken(submission.call_id)}`,
    );
    callLog.info("resubmitted call answered from its stored result");
  }

  return {
    async stop(graceMs: number = Defaults.shutdownGraceMs) {
      stopWatching();
      rpc.unsubscribe();
      await loop.stop(graceMs);
      await control.stop(graceMs);
      results.unsubscribe();
    },
  };
}
