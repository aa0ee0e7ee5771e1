import type { Msg } from "@nats-io/nats-core";
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
  ToolMessage,
} from "@toolmesh/protocol";
import {
  CallRequestSchema,
  ErrorCode,
  ToolMessageSchema,
  ToolmeshError,
  callKey,
  contextDepthError,
  decodeJson,
  decodeJsonOrUndefined,
  ensureError,
  errorToolMessage,
  malformedRequest,
  resultMsgId,
  requestIssues,
  subjectToken,
  idempotencyKeyOf,
  workOwnerOf,
} from "@toolmesh/protocol";
import type { ServeRequestsOptions } from "@toolmesh/nats";
import { ServerClock, answerRequest, publishDurable, tracedHeaders } from "@toolmesh/nats";
import {
  ANY_ARGUMENTS,
  argumentsHash,
  callRecordOf,
  knownRecordHeaders,
  stampArguments,
} from "@toolmesh/call-store";
import type { AcceptOutcome, MeshCallPlane } from "@toolmesh/call-store";
import type { ToolRegistry } from "@toolmesh/registry";
import type { Logger, ToolmeshMetrics, Tracer } from "@toolmesh/telemetry";
import {
  ATTR_TOOLMESH_CALL_ID,
  ATTR_TOOLMESH_SESSION_ID,
  ATTR_TOOLMESH_TOOL,
  markOutcome,
  processSpanOptions,
  withSpan,
} from "@toolmesh/telemetry";
import { findCloseMatches, parseArguments, resolveCall, validateToolName } from "./resolve-call.js";
import type { ControlPlane } from "@toolmesh/control-plane";
import { deadlineHeaders } from "@toolmesh/control-plane";
import type { SessionLimits } from "./session-limits.js";
import type { QuotaGate } from "./quotas.js";
import type { StoredBytes } from "./stored-bytes.js";
import type { FairShare } from "./fair-share.js";

// The resolver's handlers: a submitted call from the calls stream to its answer or its work
// message, and the dry-run request. Each takes what it needs as `deps`, so tests drive them
// with a real server and no running resolver; `startResolver` wires them to the subscriptions.

/** What the resolver's handlers work with; `startResolver` builds it once. Durations in ms. */
export interface ResolverDeps {
  subjects: Subjects;
  registry: ToolRegistry;
  log: Logger;
  tracer: Tracer;
  /** Streams, call store, server clock and the one way final messages go out. */
  plane: MeshCallPlane;
  /** Where deadlines are armed and calls outside the call layout are dead-lettered. */
  control: Pick<ControlPlane, "deadLetter">;
  /** Calls of each session in flight through this resolver. */
  limits: SessionLimits;
  /** The quotas of tenants, tenants' tools and agents; none are checked when undefined. */
  quotas?: QuotaGate | undefined;
  /** What each tenant's calls have stored, against its bound; none is checked when undefined. */
  stored?: StoredBytes | undefined;
  /** Holds calls to busy tools for a fair turn among tenants; calls go straight on when undefined. */
  fairShare?: FairShare | undefined;
  metrics: ToolmeshMetrics;
  /** Budget of a call that sets none, in ms. */
  defaultTimeoutMs: number;
  /** How long call records are kept; a call may not run longer, in ms. */
  callRetentionMs: number;
  /** Who may call what; every tool open to every session when undefined. */
  access?: ToolAccessPolicy | undefined;
}

/**
 * Decides whether a session may call a tool (an `AccessView` from `@toolmesh/catalog` fits).
 * Runs on every call: it must answer from memory.
 */
export interface ToolAccessPolicy {
  /** The error the call gets (`permission_denied`, `tool_disabled`), or `undefined` to go on. */
  check(def: ToolDefinition, at: SessionAddress, agent?: string): ToolmeshError | undefined;
}

/** The outcome of resolving one submitted call. */
export type Resolution =
  | { ok: true; resolved: ResolvedCall; request: CallRequest; argsHash: string }
  | {
      ok: false;
      error: ToolmeshError;
      toolCallId: string | undefined;
      tool: string | undefined;
      request: CallRequest | undefined;
      /** `args_hash` of the arguments as submitted, when the envelope parsed. */
      argsHash?: string | undefined;
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
  // Hashed as submitted, before the envelope parse drops keys such as a top-level `__proto__`
  // and before resolution fills defaults into an arguments object in place: the client hashes
  // the same JSON.
  const submitted = body as { tool_call: { function: { arguments: unknown } } };
  const argsHash = argumentsHash(submitted.tool_call.function.arguments);
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
    return { ok: true, resolved, request, argsHash };
  } catch (err) {
    return { ok: false, error: ensureError(err), toolCallId, tool: name, request, argsHash };
  }
}

function envelopeError(error: z.ZodError): ToolmeshError {
  if (error.issues.every((i) => i.path.join(".") === "tool_call.function.arguments")) {
    return new ToolmeshError(
      ErrorCode.InvalidArguments,
      "function.arguments must be a JSON object or a string holding one",
      { details: { issues: requestIssues(error) } },
    );
  }
  return malformedRequest(error, "malformed call request");
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
 * How dry-run requests (`rpc.{tenant}.resolve`) are served: the call resolved as it would be,
 * or the typed error it would get. Nothing is recorded or routed.
 */
export function dryRunRequests(
  deps: ResolverDeps,
): Pick<ServeRequestsOptions, "handle" | "refusal" | "log" | "what"> {
  const { subjects, registry, plane, log } = deps;
  return {
    log,
    what: "dry-run request",
    refusal: (error): ResolveReply => ({ ok: false, error }),
    handle: (body, msg): ResolveReply => {
      const tenant = subjects.parseRpcTenant(msg.subject);
      if (tenant === undefined) {
        throw new ToolmeshError(
          ErrorCode.InvalidRequest,
          `request subject "${msg.subject}" holds a tenant token no tenant id maps to`,
          { details: { subject: msg.subject } },
        );
      }
      const sessionId = (body as { session_id?: unknown } | null)?.session_id;
      const session =
        typeof sessionId === "string" && sessionId.length > 0 ? subjectToken(sessionId) : "_";
      const resolution = resolveRequest(
        registry,
        body,
        { tenant, session },
        { now: plane.clock.now(), defaultTimeoutMs: deps.defaultTimeoutMs, access: deps.access },
      );
      return resolution.ok
        ? { ok: true, resolved: resolution.resolved }
        : { ok: false, error: resolution.error.toWire() };
    },
  };
}

/** Answers one dry-run request (see {@link dryRunRequests}). */
export function answerDryRun(deps: ResolverDeps, msg: Msg): Promise<void> {
  return answerRequest(msg, dryRunRequests(deps));
}

/**
 * Handles one submitted call from the calls stream: resolves it, answers an invalid one on its
 * session, routes a valid one ({@link routeCall}), then acks it. A call that cannot be handed on
 * (a publish that may pass later failed) is handed back with `nak` and a growing delay (1 s,
 * doubling, at most 10 s); one on a subject outside the call layout is dead-lettered.
 */
export async function handleCall(deps: ResolverDeps, msg: JsMsg): Promise<void> {
  const { subjects, registry, log, tracer, control, metrics } = deps;
  const address = subjects.parseSessionSubject(msg.subject);
  if (address === undefined) {
    // No answer can be addressed: a token such as a literal `*` would make the session
    // subject a wildcard. The letter keeps the message for operators.
    log.error(
      { subject: msg.subject },
      "call on a subject outside the call layout (or with a token no id maps to); dead-lettered",
    );
    await control.deadLetter(msg.info.stream, msg.seq, "not a call subject");
    msg.ack();
    return;
  }
  const acceptedAt = ServerClock.timestampOf(msg);
  deps.plane.clock.observe(acceptedAt);
  await withSpan(
    tracer,
    "resolve",
    processSpanOptions(msg, { [ATTR_TOOLMESH_SESSION_ID]: address.session }),
    async (span) => {
      let resolution: Resolution;
      try {
        resolution = resolveRequest(registry, decodeJson(msg.data), address, {
          now: acceptedAt,
          defaultTimeoutMs: deps.defaultTimeoutMs,
          access: deps.access,
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
        if (resolution.ok) {
          // A held call is acknowledged when its turn comes (or its deadline).
          if ((await routeCall(deps, resolution, msg, callLog)) === "held") return;
        } else if (await answerKnownKey(deps, resolution, address, msg.seq, callLog)) {
          callLog.info({ code: resolution.error.code }, "refused resubmission of a known call");
        } else {
          await answerInvalid(deps, resolution, address, msg.seq);
          callLog.info({ code: resolution.error.code, err: resolution.error }, "call rejected");
        }
        msg.ack();
      } catch (err) {
        callLog.error({ err: ensureError(err) }, "cannot hand the call on; it will be redelivered");
        msg.nak(Math.min(1_000 * 2 ** (msg.info.deliveryCount - 1), 10_000));
      }
    },
  );
}

/**
 * Routes a resolved call: refuses it when it could outlive its record or is past its deadline,
 * answers `overloaded` when its session is over its in-flight limit, accepts it in the call
 * store (a known key is answered as a resubmission), publishes it on its tool's work subject and
 * arms its deadline — or, when the tool is busy, holds it for its fair turn ("held": the message
 * is acknowledged then, not by the caller). Throws when a publish fails in a way that may pass:
 * the caller hands the call back.
 */
export async function routeCall(
  deps: ResolverDeps,
  resolution: Extract<Resolution, { ok: true }>,
  msg: JsMsg,
  callLog: Logger,
): Promise<"held" | undefined> {
  const { subjects, plane, limits, callRetentionMs } = deps;
  const { js, store, clock, publishFinal } = plane;
  const { resolved, request } = resolution;
  const key = callKey(resolved.address, resolved.idempotency_key);
  const target = {
    tool_call_id: resolved.call_id,
    name: resolved.tool,
    session_id: resolved.session_id,
  };
  const { argsHash } = resolution;
  const publishAnswer = (error: ToolmeshError, msgId: string): Promise<unknown> =>
    publishFinal(
      subjects.result(resolved.address, resolved.call_id),
      { ...errorToolMessage(target, error, { attempts: 0 }), args_hash: argsHash },
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
      argsHash,
    };
    if (!(await answerKnownKey(deps, refused, resolved.address, msg.seq, callLog)))
      await publishAnswer(error, resultMsgId(key));
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
    deps.metrics.tenantRefused(
      labelledTenant(deps, resolved, request),
      ErrorCode.Overloaded,
      "session_max_in_flight",
    );
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
  const { fairShare } = deps;
  const held =
    fairShare !== undefined && (await fairShare.busy(resolved.tool, resolved.address.tenant));
  const refusal =
    deps.stored?.refusal(resolved.address.tenant) ??
    (await admitByQuota(deps, resolved, request, key, held));
  if (refusal !== undefined) {
    limits.release(resolved);
    deps.metrics.tenantRefused(
      resolved.address.tenant,
      refusal.code,
      typeof refusal.details?.quota === "string" ? refusal.details.quota : "unknown",
    );
    await publishAnswer(refusal, `refused:${key}:${msg.seq}`);
    callLog.info({ code: refusal.code, details: refusal.details }, "call refused by a quota");
    return;
  }
  const record = callRecordOf(resolved, argsHash);
  const accepted = await store.accept(record);
  if (accepted.status === "conflict" || accepted.status === "done") {
    limits.release(resolved);
    await releaseQuota(deps, resolved, request, key);
    await answerResubmission(deps, accepted, resolved, request, msg.seq, callLog);
    return;
  }
  if (accepted.status === "in_flight") {
    // Accepted before but maybe never routed: a crash between accepting and routing, or a
    // killed server that forgot the first delivery (it comes back as delivery 1). Route
    // again: the work's message id makes a repeat harmless within the window.
    callLog.info("call accepted before; routing it again");
    // Its final message goes to the call id accepted first: another id is told so.
    if (accepted.record.call_id !== resolved.call_id)
      await answerResubmission(deps, accepted, resolved, request, msg.seq, callLog);
  }
  const { address } = resolved;
  const fairShareId = `${address.tenant}.${address.session}.${subjectToken(resolved.call_id)}`;
  const publishWork = async (): Promise<void> => {
    let routed: { duplicate: boolean };
    try {
      // The record's revision goes along, so the executor need not read the record (ADR 0027),
      // and the deadline, which every resolver's deadline keeper reads as the work goes by (ADR 0028).
      // A tool owner's tool waits on its owner's work stream (ADR 0041).
      const definition = deps.registry.get(resolved.tool)?.definition;
      const owner = definition && workOwnerOf(definition);
      const known = knownRecordHeaders(record, accepted);
      // An owner's executor ends the call through the owner services, which must not take the
      // record from it: kept here, it spares them a read when this process answers.
      if (owner !== undefined && known !== undefined)
        store.remember(resolved, { record, revision: accepted.revision });
      routed = await publishDurable(js, subjects.work(resolved.tool, owner), resolved, {
        msgId: key,
        headers: deadlineHeaders(resolved, tracedHeaders(known)),
      });
    } catch (err) {
      const error = ensureError(err);
      if (error.retryable) throw err;
      // The record itself cannot be sent (defaults made it outgrow the limit): answer now.
      await plane.finalize(resolved, errorToolMessage(target, error, { attempts: 0 }));
      return;
    }
    if (routed.duplicate && accepted.status === "new") {
      // The work stream remembers routing this key, but its record was gone (expired or
      // purged): the work was dropped as a duplicate and no executor will see it, nor will the
      // deadline keeper. Answer it from its stored result, or refuse it; never leave it waiting.
      await answerVanishedRecord(deps, resolved, target, msg.seq, callLog);
      return;
    }
    callLog.debug({ missing_optional: resolved.missing_optional }, "call routed to its executors");
  };
  if (held) {
    fairShare.hold(resolved.tool, {
      id: fairShareId,
      tenant: address.tenant,
      msg,
      deadlineAt: resolved.deadline_at,
      dispatch: async () => {
        await dequeueQuota(deps, resolved, request, key);
        await publishWork();
        msg.ack();
      },
      expire: async () => {
        await plane.finalize(
          resolved,
          errorToolMessage(
            target,
            new ToolmeshError(
              ErrorCode.DeadlineExceeded,
              `call ${resolved.call_id} passed its deadline while waiting for its turn at a busy tool`,
              { details: { deadline_at: resolved.deadline_at, timeout_ms: resolved.timeout_ms } },
            ),
            { attempts: 0 },
          ),
        );
        msg.ack();
      },
    });
    callLog.debug("tool busy; call held for its fair turn");
    return "held";
  }
  if (fairShare === undefined) {
    await publishWork();
    return undefined;
  }
  const started = { id: fairShareId, tenant: address.tenant, deadlineAt: resolved.deadline_at };
  fairShare.started(resolved.tool, started);
  try {
    await publishWork();
  } catch (err) {
    fairShare.ended(started.id);
    throw err;
  }
  return undefined;
}

/**
 * The tenant token a refusal is counted under: only tenants with a quota are labelled, which
 * keeps the label's values bounded.
 */
function labelledTenant(
  deps: ResolverDeps,
  resolved: ResolvedCall,
  request: CallRequest,
): string | undefined {
  const { tenant } = resolved.address;
  const scopes = deps.quotas?.view.scopesOf(tenant, resolved.tool, request.agent) ?? [];
  return scopes.length > 0 ? tenant : undefined;
}

/**
 * Counts a call into the quotas of its tenant, tool and agent, or says which refused it. Free
 * for tenants without a quota (one map lookup).
 */
async function admitByQuota(
  deps: ResolverDeps,
  resolved: ResolvedCall,
  request: CallRequest,
  key: string,
  queued: boolean,
): Promise<ToolmeshError | undefined> {
  const { quotas } = deps;
  if (quotas === undefined) return undefined;
  const scopes = quotas.view.scopesOf(resolved.address.tenant, resolved.tool, request.agent);
  if (scopes.length === 0) return undefined;
  return quotas.admit(
    { key, deadline_at: resolved.deadline_at },
    { ...resolved.address, callToken: subjectToken(resolved.call_id) },
    scopes,
    queued,
  );
}

async function dequeueQuota(
  deps: ResolverDeps,
  resolved: ResolvedCall,
  request: CallRequest,
  key: string,
): Promise<void> {
  const { quotas } = deps;
  if (quotas === undefined) return;
  const scopes = quotas.view.scopesOf(resolved.address.tenant, resolved.tool, request.agent);
  if (scopes.length > 0) await quotas.dequeued({ key, deadline_at: resolved.deadline_at }, scopes);
}

async function releaseQuota(
  deps: ResolverDeps,
  resolved: ResolvedCall,
  request: CallRequest,
  key: string,
): Promise<void> {
  const { quotas } = deps;
  if (quotas === undefined) return;
  const { address } = resolved;
  quotas.ended(address.tenant, address.session, subjectToken(resolved.call_id));
  const scopes = quotas.view.scopesOf(address.tenant, resolved.tool, request.agent);
  if (scopes.length > 0) await quotas.release(key, scopes);
}

/**
 * Ends a call whose work was routed before under a record that no longer exists: with the final
 * message the sessions stream still holds for it, else with `unavailable` (not retryable: its
 * outcome is unknown, and within the work stream's duplicate window it would not run again).
 */
async function answerVanishedRecord(
  deps: ResolverDeps,
  resolved: ResolvedCall,
  target: { tool_call_id: string; name: string; session_id: string },
  seq: number,
  callLog: Logger,
): Promise<void> {
  const { subjects, plane } = deps;
  const subject = subjects.result(resolved.address, resolved.call_id);
  const stored = await plane.jsm.streams
    .getMessage(subjects.streams.sessions, { last_by_subj: subject })
    .catch(() => null);
  const earlier =
    stored === null ? undefined : ToolMessageSchema.safeParse(decodeJsonOrUndefined(stored.data));
  const message: ToolMessage =
    earlier?.success === true
      ? earlier.data
      : errorToolMessage(
          target,
          new ToolmeshError(
            ErrorCode.Unavailable,
            `call ${resolved.call_id} was routed before and its record is gone: its outcome is unknown, so it is not run again; submit it under a new idempotency key`,
            { retryable: false, details: { idempotency_key: resolved.idempotency_key } },
          ),
          { attempts: 0 },
        );
  const outcome = await plane.store.finish(resolved, message);
  // Under a message id of its own: the sessions stream may still remember the earlier one.
  await plane.publishFinal(
    subject,
    outcome?.result ?? message,
    `result:${callKey(resolved.address, resolved.idempotency_key)}:${seq}`,
  );
  callLog.warn(
    { answered_from_store: earlier?.success === true },
    "call routed before under a record that is gone: answered, not run again",
  );
}

/**
 * Answers an invalid call on its session with its typed error (and, for `missing_arguments`, an
 * event for the schema expander). A call without a usable id is answered as `invalid-{seq}`.
 */
export async function answerInvalid(
  deps: ResolverDeps,
  resolution: Extract<Resolution, { ok: false }>,
  address: SessionAddress,
  seq: number,
): Promise<void> {
  const { subjects, registry } = deps;
  const { js, publishFinal } = deps.plane;
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
  if (resolution.argsHash !== undefined) message.args_hash = resolution.argsHash;
  await publishFinal(
    subjects.result(address, callId),
    message,
    resultMsgId(
      callKey(
        address,
        request?.idempotency_key ?? `${request?.session_id ?? address.session}/${callId}`,
      ),
    ),
  );
}

/**
 * A refused submission whose key names a call the store knows is a resubmission of that
 * call: answered as one ({@link answerResubmission}) instead of on the call's result subject,
 * where its error would take the place of the call's own final message. False when the key
 * names no call (or the envelope gave no key): answer it as an invalid call.
 */
export async function answerKnownKey(
  deps: ResolverDeps,
  resolution: Extract<Resolution, { ok: false }>,
  address: SessionAddress,
  seq: number,
  callLog: Logger,
): Promise<boolean> {
  const { request } = resolution;
  if (request === undefined || subjectToken(request.session_id) !== address.session) return false;
  const key = idempotencyKeyOf(request, request.tool_call.id);
  const stored = await deps.plane.store.get({ idempotency_key: key, address });
  if (stored === undefined) return false;
  const { record } = stored;
  const submission = {
    call_id: request.tool_call.id,
    session_id: request.session_id,
    tool: request.tool_call.function.name,
    address,
    idempotency_key: key,
  };
  const argsHash = resolution.argsHash ?? argumentsHash(request.tool_call.function.arguments);
  const conflicting =
    record.args_hash !== ANY_ARGUMENTS &&
    (record.args_hash !== argsHash || record.tool !== submission.tool);
  if (conflicting) {
    await answerResubmission(
      deps,
      { status: "conflict", record },
      submission,
      request,
      seq,
      callLog,
    );
  } else if (record.state === "done" && record.result !== undefined) {
    const result = record.result;
    await answerResubmission(
      deps,
      { status: "done", record: { ...record, result } },
      submission,
      request,
      seq,
      callLog,
    );
  } else if (record.call_id !== submission.call_id) {
    await answerResubmission(
      deps,
      { status: "in_flight", record, revision: stored.revision },
      submission,
      request,
      seq,
      callLog,
    );
  }
  // In flight under this call id: the call's own final message answers it.
  return true;
}

/**
 * Answers a submission whose key names a call accepted before, without touching that call:
 * a conflicting reuse of the key (other arguments or tool) gets `idempotency_conflict` on its
 * own `rejected.{seq}` subject, never on the call's result subject; a call that ended has its
 * stored final message published again for this submission's call id.
 */
export async function answerResubmission(
  deps: ResolverDeps,
  outcome: Extract<AcceptOutcome, { status: "conflict" | "done" | "in_flight" }>,
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
  const { subjects } = deps;
  const { js, publishFinal } = deps.plane;
  const key = callKey(submission.address, submission.idempotency_key);
  if (outcome.status === "conflict" || outcome.status === "in_flight") {
    const owner = outcome.record;
    const error =
      outcome.status === "conflict"
        ? new ToolmeshError(
            ErrorCode.IdempotencyConflict,
            `idempotency key "${submission.idempotency_key}" was used before with different arguments`,
            {
              details: {
                idempotency_key: submission.idempotency_key,
                tool: owner.tool,
                call_id: owner.call_id,
              },
            },
          )
        : new ToolmeshError(
            ErrorCode.IdempotencyInFlight,
            `idempotency key "${submission.idempotency_key}" names call ${owner.call_id}, still running: its final message goes to that call id`,
            {
              details: {
                idempotency_key: submission.idempotency_key,
                tool: owner.tool,
                call_id: owner.call_id,
                deadline_at: owner.deadline_at,
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
    callLog.info({ seq, code: error.code }, "submission under a key another call holds refused");
    return;
  }
  // The same key may come back under another call id: answer that id. A call cancelled
  // before it arrived gets its tool's name here.
  await publishFinal(
    subjects.result(submission.address, submission.call_id),
    {
      ...stampArguments(outcome.record.result, outcome.record),
      tool_call_id: submission.call_id,
      session_id: submission.session_id,
      name: submission.tool,
    },
    outcome.record.call_id === submission.call_id
      ? resultMsgId(key)
      : resultMsgId(key, subjectToken(submission.call_id)),
  );
  callLog.info("resubmitted call answered from its stored result");
}
