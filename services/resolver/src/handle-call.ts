import type { Msg } from "@nats-io/nats-core";
import type { JsMsg, PubAck } from "@nats-io/jetstream";
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
  auditEventMsgId,
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
  refusedMsgId,
  resultMsgId,
  requestIssues,
  subjectToken,
  idempotencyKeyOf,
  workOwnerOf,
  deliveryResultMsgId,
  missingArgumentsMsgId,
  rejectedMsgId,
  invalidResultMsgId,
} from "@toolmesh/protocol";
import type { RequestKind } from "@toolmesh/nats";
import {
  ServerClock,
  answerRequest,
  handBackDelayMs,
  isWrongLastSequence,
  publishDurable,
  rpcTenantScope,
  tracedHeaders,
} from "@toolmesh/nats";
import {
  ANY_ARGUMENTS,
  argumentsHash,
  callRecordOf,
  knownRecordHeaders,
  stampArguments,
} from "@toolmesh/call-store";
import type { AcceptOutcome, CallRecord, MeshCallPlane } from "@toolmesh/call-store";
import type { ToolRegistry } from "@toolmesh/registry";
import type { Logger, ToolmeshMetrics, Tracer } from "@toolmesh/telemetry";
import {
  ATTR_TOOLMESH_CALL_ID,
  ATTR_TOOLMESH_SESSION_ID,
  ATTR_TOOLMESH_TOOL,
  lazyChild,
  markOutcome,
  processSpanOptions,
  withSpan,
} from "@toolmesh/telemetry";
import {
  findCloseMatches,
  lineAndColumn,
  parseArguments,
  readCallIds,
  resolveCall,
  scanJsonError,
  validateToolName,
} from "./resolve-call.js";
import type { ControlPlane } from "@toolmesh/control-plane";
import { deadlineHeaders } from "@toolmesh/control-plane";
import type { Admission, AdmissionTicket } from "./admission.js";
import { PolicyDecider } from "@toolmesh/policy";
import type { AuditTrail } from "@toolmesh/audit";
import { AuditEventType } from "@toolmesh/audit";
import type { PolicyDecision } from "@toolmesh/policy";
import type { ApprovalDesk } from "./approvals.js";
import { routedUnderRecord } from "./routed-before.js";

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
  /** Session slots, fair turns and quotas: whether a resolved call goes on, waits or is refused. */
  admission: Admission;
  metrics: ToolmeshMetrics;
  /** Budget of a call that sets none, in ms. */
  defaultTimeoutMs: number;
  /** How long call records are kept; a call may not run longer, in ms. */
  callRetentionMs: number;
  /** Who may call what; every tool open to every session when undefined. */
  access?: ToolAccessPolicy | undefined;
  /** The Cedar policy sets in force (docs/policy.md); no call is decided when undefined. */
  policies?: PolicyDecider | undefined;
  /** Where each call's admission, refusal and policy decision are recorded (ADR 0060). */
  audit?: AuditTrail | undefined;
  /** Where calls waiting for approval are kept (ADR 0059); such calls are refused without it. */
  approvals?: ApprovalDesk | undefined;
}

/**
 * Decides whether a session may call a tool (an `AccessView` from `@toolmesh/catalog` fits).
 * Runs on every call: it must answer from memory.
 */
export interface ToolAccessPolicy {
  /**
   * The error the call gets (`permission_denied`, `tool_disabled`), or `undefined` to go on.
   * `subject` is who the call acts for (its verified identity), when it names one.
   */
  check(
    def: ToolDefinition,
    at: SessionAddress,
    agent?: string,
    subject?: string,
  ): ToolmeshError | undefined;
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
      /** The session id read from a body that is not JSON, when it could be read. */
      sessionId?: string | undefined;
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
  const toolCallId = request.tool_call.id;
  const name = request.tool_call.function.name;
  const raw = submitted.tool_call.function.arguments;
  try {
    // Arguments nested deeper than the limit cannot even be hashed (JSON.stringify recurses).
    if (typeof raw !== "string") parseArguments(raw);
  } catch (err) {
    // Without `request`: nothing downstream may hash or copy these arguments.
    return {
      ok: false,
      error: ensureError(err),
      toolCallId,
      tool: name,
      request: undefined,
      sessionId: request.session_id,
    };
  }
  const argsHash = argumentsHash(raw);
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
    const foreign = foreignIdentity(request, address);
    if (foreign !== undefined) throw foreign;
    validateToolName(name);
    const { access } = options;
    const subject = request.identity?.subject;
    const tool = registry.get(name);
    if (tool === undefined) {
      throw unknownTool(name, registry, (definition) =>
        access === undefined
          ? true
          : access.check(definition, address, request.agent, subject) === undefined,
      );
    }
    const denied = access?.check(tool.definition, address, request.agent, subject);
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

/** `unknown_tool`, suggesting close names among the tools the session `may` call. */
function unknownTool(
  name: string,
  registry: ToolRegistry,
  may: (definition: ToolDefinition) => boolean,
): ToolmeshError {
  const callable = [...registry.tools()]
    .filter((t) => may(t.definition))
    .map((t) => t.definition.name);
  const closeMatches = findCloseMatches(name, callable);
  return new ToolmeshError(
    ErrorCode.UnknownTool,
    closeMatches.length > 0
      ? `unknown tool "${name}"; did you mean ${closeMatches.map((m) => `"${m}"`).join(", ")}?`
      : `unknown tool "${name}"`,
    { details: { tool: name, close_matches: closeMatches } },
  );
}

/**
 * A call may act only for a user of the tenant it was submitted in: the subject's tenant token
 * is fixed by the submitter's NATS account (a tenant's frontends publish only under their own
 * tenant), so an identity naming another tenant is a claim on someone else's users.
 */
function foreignIdentity(request: CallRequest, address: SessionAddress): ToolmeshError | undefined {
  const identity = request.identity;
  if (identity === undefined || subjectToken(identity.tenant) === address.tenant) return undefined;
  return new ToolmeshError(
    ErrorCode.PermissionDenied,
    "identity.tenant is not the tenant the call was submitted in: a call may act only for its own tenant's users",
    { details: { identity_tenant: identity.tenant } },
  );
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

const lenientUtf8 = new TextDecoder("utf-8", { fatal: false });

/**
 * A call request that is not UTF-8 or not JSON, answered in the mesh's own words (a parser's
 * message is no contract) and, when the part before the damage holds them, on the call's own
 * id and session id.
 */
function brokenBody(err: unknown, data: Uint8Array): Extract<Resolution, { ok: false }> {
  const text = lenientUtf8.decode(data);
  const ids = readCallIds(text);
  let error: ToolmeshError;
  if (err instanceof TypeError) {
    error = new ToolmeshError(ErrorCode.InvalidRequest, "call request is not valid UTF-8", {
      cause: err,
    });
  } else {
    const { position, reason } = scanJsonError(text);
    const { line, column } = lineAndColumn(text, position);
    error = new ToolmeshError(
      ErrorCode.InvalidRequest,
      `call request is not JSON (line ${line}, column ${column}): ${reason}`,
      { details: { position, line, column, reason }, cause: err },
    );
  }
  return {
    ok: false,
    error,
    toolCallId: ids.toolCallId,
    tool: ids.tool,
    request: undefined,
    sessionId: ids.sessionId,
  };
}

/**
 * How dry-run requests (`rpc.{tenant}.resolve`) are served: the call resolved as it would be,
 * or the typed error it would get. Nothing is recorded or routed.
 */
export function dryRunRequests(deps: ResolverDeps): RequestKind<string> {
  const { subjects, registry, plane, log } = deps;
  return {
    log,
    what: "dry-run request",
    scope: rpcTenantScope(subjects),
    handle: (body, msg, tenant): ResolveReply => {
      const sessionId = (body as { session_id?: unknown } | null)?.session_id;
      const session =
        typeof sessionId === "string" && sessionId.length > 0 ? subjectToken(sessionId) : "_";
      const resolution = resolveRequest(
        registry,
        body,
        { tenant, session },
        { now: plane.clock.now(), defaultTimeoutMs: deps.defaultTimeoutMs, access: deps.access },
      );
      if (resolution.ok) return { ok: true, resolved: resolution.resolved };
      // A failure of ours, answered like the call would be: logged as the server would log it.
      if (resolution.error.code === ErrorCode.Internal)
        log.error({ err: resolution.error, subject: msg.subject }, "dry-run request failed");
      return { ok: false, error: resolution.error.toWire() };
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
      let body: unknown;
      let resolution: Resolution | undefined;
      try {
        body = decodeJson(msg.data);
      } catch (err) {
        resolution = brokenBody(err, msg.data);
      }
      resolution ??= resolveRequest(registry, body, address, {
        now: acceptedAt,
        defaultTimeoutMs: deps.defaultTimeoutMs,
        access: deps.access,
      });
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
      const callLog = lazyChild(log, { callId, sessionId: address.session, tool });
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
        msg.nak(handBackDelayMs(msg.info.deliveryCount));
      }
    },
  );
}

/**
 * Routes a resolved call: refuses it when it could outlive its record or is past its deadline,
 * asks admission whether it goes on (a session over its in-flight limit or a quota refuses it,
 * a busy tool holds it), accepts it in the call store (a known key is answered as a
 * resubmission) while its admission is written to the audit trail, then publishes it on its
 * tool's work subject and arms its deadline — or, when admission holds it, does that at its
 * fair turn ("held": the message is acknowledged then, not by the caller). Throws when a
 * publish fails in a way that may pass: the caller hands the call back.
 */
export async function routeCall(
  deps: ResolverDeps,
  resolution: Extract<Resolution, { ok: true }>,
  msg: JsMsg,
  callLog: Logger,
): Promise<"held" | undefined> {
  const route = routeOf(deps, resolution, msg, callLog);
  const { resolved, request, key } = route;
  const now = deps.plane.clock.now();
  const unfit =
    unroutable(resolved, deps.callRetentionMs, now) ??
    deps.audit?.refusal(resolved.address.tenant) ??
    (await policyRefusal(route));
  if (unfit !== undefined) {
    await refuseUnaccepted(route, unfit);
    return undefined;
  }
  if ((await awaitApproval(route)) === "waiting") return undefined;
  const admitted = await deps.admission.admit(
    { resolved, request, key, seq: msg.seq, messageBytes: msg.data.length },
    now,
  );
  if (admitted.decision === "refuse") {
    const { error } = admitted;
    await publishRefusal(route, error, admitted.msgId);
    if (admitted.logged)
      callLog.info({ code: error.code, details: error.details }, "call refused by a quota");
    return undefined;
  }
  const { ticket } = admitted;
  // The admission is written while the call is accepted (two round trips at once); the call
  // goes on only when both passed.
  const record = callRecordOf(resolved, route.argsHash);
  const [recorded, outcome] = await Promise.all([
    recordAdmission(route, admitted.decision === "hold"),
    deps.plane.store.accept(record),
  ]);
  if (!recorded) {
    await ticket.withdraw();
    await refuseUnrecorded(route, { record, outcome });
    return undefined;
  }
  const accepted = await settleAcceptance(route, ticket, { record, outcome });
  if (accepted === undefined) return undefined;
  const work = (): Promise<void> => publishWork({ ...route, seq: msg.seq }, accepted);
  if (admitted.decision === "hold") {
    holdForTurn(route, ticket, work);
    return "held";
  }
  await ticket.publish(work);
  return undefined;
}

/**
 * Records the call's admission in its tenant's trail: in `required` mode the call goes on only
 * once that is written (false: it could not be), otherwise it is recorded on the side.
 */
async function recordAdmission(route: Route, held: boolean): Promise<boolean> {
  const { audit } = route.deps;
  if (audit === undefined) return true;
  const { resolved } = route;
  // Assigned onto the ids, not spread before more fields: V8's slow path, on every call's path.
  const event = Object.assign(auditIds(resolved), {
    id: auditEventMsgId(AuditEventType.Admitted, route.key, route.msg.seq),
    type: AuditEventType.Admitted,
    data: {
      args_hash: route.argsHash,
      deadline_at: resolved.deadline_at,
      held,
      ...audit.argumentsOf(resolved.address.tenant, resolved.arguments),
    },
  });
  if (audit.required) return audit.tryRecord(resolved.address.tenant, event);
  void audit.record(resolved.address.tenant, event);
  return true;
}

/** What names a call in its audit events. */
function auditIds(resolved: ResolvedCall): {
  call_id: string;
  session: string;
  tool: string;
  at: number;
} {
  return {
    call_id: resolved.call_id,
    session: resolved.session_id,
    tool: resolved.tool,
    at: Date.now(),
  };
}

function auditUnavailable(resolved: ResolvedCall): ToolmeshError {
  return new ToolmeshError(
    ErrorCode.Unavailable,
    `call ${resolved.call_id} was not run: its admission cannot be recorded in the audit trail now (TOOLMESH_AUDIT=required); submit it again later`,
    { retryable: true, details: { tenant: resolved.address.tenant } },
  );
}

/**
 * Records a refusal (a call answered with an error before it ran) in its tenant's trail, under
 * the id of the delivery it answers (`key` and `seq`: {@link auditEventMsgId}).
 */
function recordRefusal(
  deps: ResolverDeps,
  tenant: string,
  ids: { call_id?: string | undefined; session?: string | undefined; tool?: string | undefined },
  error: ToolmeshError,
  delivery: { key: string; seq: number },
): void {
  void deps.audit?.record(tenant, {
    ...ids,
    id: auditEventMsgId(AuditEventType.Refused, delivery.key, delivery.seq),
    type: AuditEventType.Refused,
    at: Date.now(),
    data: { code: error.code, message: error.message },
  });
}

/** One resolved call on its way to its tool's work, and what answers it on the way. */
interface Route {
  deps: ResolverDeps;
  resolved: ResolvedCall;
  request: CallRequest;
  /** Its call key: the work message's id and what quotas count it by. */
  key: string;
  argsHash: string;
  target: { tool_call_id: string; name: string; session_id: string };
  msg: JsMsg;
  callLog: Logger;
  /** The policies' decision, once made (and allowing). */
  policy?: PolicyDecision | undefined;
}

function routeOf(
  deps: ResolverDeps,
  resolution: Extract<Resolution, { ok: true }>,
  msg: JsMsg,
  callLog: Logger,
): Route {
  const { resolved, request, argsHash } = resolution;
  return {
    deps,
    resolved,
    request,
    key: callKey(resolved.address, resolved.idempotency_key),
    argsHash,
    target: {
      tool_call_id: resolved.call_id,
      name: resolved.tool,
      session_id: resolved.session_id,
    },
    msg,
    callLog,
  };
}

/** Why a call cannot be routed at all: it would outlive its record, or its deadline passed. */
function unroutable(
  resolved: ResolvedCall,
  callRetentionMs: number,
  now: number,
): ToolmeshError | undefined {
  if (resolved.timeout_ms > callRetentionMs) {
    // Its record would expire while it runs, and with it the guarantee of one final message.
    return new ToolmeshError(
      ErrorCode.InvalidRequest,
      `timeout_ms ${resolved.timeout_ms} is longer than calls are remembered (${callRetentionMs} ms)`,
      { details: { timeout_ms: resolved.timeout_ms, max_timeout_ms: callRetentionMs } },
    );
  }
  if (now >= resolved.deadline_at) {
    // It waited in the calls stream past its deadline (no resolver was running).
    return new ToolmeshError(
      ErrorCode.DeadlineExceeded,
      `call ${resolved.call_id} passed its deadline before it was resolved`,
      { details: { deadline_at: resolved.deadline_at, timeout_ms: resolved.timeout_ms } },
    );
  }
  return undefined;
}

/**
 * The policies' refusal of a call, decided before anything is counted or stored
 * (docs/policy.md); counts the decision. None when no policy set is in force. A decision that
 * reads the arguments is made with the other calls of this turn of the event loop.
 */
async function policyRefusal(route: Route): Promise<ToolmeshError | undefined> {
  const { deps, resolved, callLog } = route;
  const definition = deps.registry.get(resolved.tool)?.definition;
  const policy = await deps.policies?.decideCallSoon(resolved, definition);
  if (policy === undefined) return undefined;
  const effect = !policy.allowed ? "deny" : policy.approval === undefined ? "allow" : "approval";
  deps.metrics.policyDecision(effect);
  void deps.audit?.record(resolved.address.tenant, {
    ...auditIds(resolved),
    id: auditEventMsgId(AuditEventType.PolicyDecided, route.key, route.msg.seq),
    type: AuditEventType.PolicyDecided,
    data: { effect, policies: policy.policies, version: policy.version },
  });
  if (policy.allowed) {
    // Kept with the call's record and work (the approval, once given, is added to it).
    resolved.decision = {
      effect: policy.approval === undefined ? "allow" : "approval",
      policies: policy.policies,
      policy_version: policy.version,
    };
    route.policy = policy;
    return undefined;
  }
  callLog.info({ policies: policy.policies, version: policy.version }, "call refused by policy");
  return PolicyDecider.refusal(policy, resolved.tool);
}

/**
 * Keeps a call a permit lets through only with a person's approval (ADR 0059): "waiting" when
 * it now waits (or already did: the same call submitted again), answered as a resubmission
 * when its key names a waiting call with other arguments. Undefined when the call goes on: it
 * needs no approval, or it was decided before and the call store answers it.
 */
async function awaitApproval(route: Route): Promise<"waiting" | undefined> {
  const { deps, resolved, request, msg, callLog, policy } = route;
  if (policy?.approval === undefined) return undefined;
  const definition = deps.registry.get(resolved.tool)?.definition;
  if (deps.approvals === undefined || definition === undefined) {
    await refuseUnaccepted(
      route,
      new ToolmeshError(
        ErrorCode.Unavailable,
        `call of tool "${resolved.tool}" needs approval, which this resolver cannot keep`,
      ),
    );
    return "waiting";
  }
  const held = await deps.approvals.hold(
    resolved,
    route.argsHash,
    { ...policy, approval: policy.approval },
    definition,
  );
  if (held.status === "decided") return undefined;
  if (held.status === "conflict")
    await answerResubmission(
      deps,
      { status: "conflict", record: held.record },
      resolved,
      request,
      msg.seq,
      callLog,
    );
  else callLog.info({ mode: policy.approval.mode }, "call waits for approval");
  return "waiting";
}

/** Answers a call on its session with `error` as its final message, under `msgId`. */
async function publishRefusal(route: Route, error: ToolmeshError, msgId: string): Promise<void> {
  const { deps, resolved, target, argsHash, key, msg } = route;
  recordRefusal(deps, resolved.address.tenant, auditIds(resolved), error, { key, seq: msg.seq });
  await deps.plane.publishFinal(
    deps.subjects.result(resolved.address, resolved.call_id),
    { ...errorToolMessage(target, error, { attempts: 0 }), args_hash: argsHash },
    msgId,
  );
}

/**
 * Refuses a call before acceptance, which must not take the place of a known call's result:
 * the refusal answers this delivery (its id is the delivery's), so a later submission of the
 * same key that runs stores its own result.
 */
async function refuseUnaccepted(route: Route, error: ToolmeshError): Promise<void> {
  const { deps, resolved, request, argsHash, msg, callLog } = route;
  const refused = {
    ok: false as const,
    error,
    toolCallId: resolved.call_id,
    tool: resolved.tool,
    request,
    argsHash,
  };
  if (!(await answerKnownKey(deps, refused, resolved.address, msg.seq, callLog)))
    await publishRefusal(route, error, refusedMsgId(route.key, msg.seq));
}

/** A call's record as accepted in the call store. */
interface Accepted {
  record: CallRecord;
  /** Accepted now (`new`) or before (`in_flight`): a call to route either way. */
  outcome: Exclude<AcceptOutcome, { status: "conflict" | "done" }>;
}

/**
 * Refuses a call whose admission could not be written (`unavailable`, to try again later): a
 * record accepted for it just now is taken back, so a retry is accepted afresh; a known key is
 * answered as {@link refuseUnaccepted} does.
 */
async function refuseUnrecorded(
  route: Route,
  { record, outcome }: { record: CallRecord; outcome: AcceptOutcome },
): Promise<void> {
  const error = auditUnavailable(route.resolved);
  if (outcome.status !== "new") {
    await refuseUnaccepted(route, error);
    return;
  }
  try {
    await route.deps.plane.store.withdraw(record, outcome.revision);
  } catch (err) {
    if (isWrongLastSequence(err)) {
      // Taken up meanwhile by another delivery of the call (this one outlived its ack wait),
      // which recorded its admission and routes it: nothing to refuse.
      route.callLog.info("call taken up by another delivery of it; not refused");
      return;
    }
    // Left in flight: a retry routes it then.
    route.callLog.warn({ err }, "cannot take back the record of a call refused unrecorded");
  }
  await publishRefusal(route, error, refusedMsgId(route.key, route.msg.seq));
}

/**
 * What the call store's acceptance means for the call. A known key's call (another call id, or
 * one that ended) is answered as a resubmission and gives its admission back: `undefined`,
 * nothing to route.
 */
async function settleAcceptance(
  route: Route,
  ticket: AdmissionTicket,
  { record, outcome: accepted }: { record: CallRecord; outcome: AcceptOutcome },
): Promise<Accepted | undefined> {
  const { deps, resolved, request, msg, callLog } = route;
  let outcome = accepted;
  if (outcome.status === "conflict" || outcome.status === "done") {
    await ticket.withdraw();
    await answerResubmission(deps, outcome, resolved, request, msg.seq, callLog);
    return undefined;
  }
  if (outcome.status === "in_flight") {
    // Accepted before but maybe never routed: a crash between accepting and routing, or a
    // killed server that forgot the first delivery (it comes back as delivery 1), or a
    // delivery still at work past its ack wait. Taken up under a new revision (the delivery
    // that accepted it can no longer take it back), then routed again: the work's message id
    // makes a repeat harmless within the window.
    try {
      outcome = { ...outcome, revision: await deps.plane.store.takeUp(record, outcome.revision) };
    } catch (err) {
      await ticket.withdraw();
      throw err;
    }
    callLog.info("call accepted before; routing it again");
    // Its final message goes to the call id accepted first: another id is told so.
    if (outcome.record.call_id !== resolved.call_id)
      await answerResubmission(deps, outcome, resolved, request, msg.seq, callLog);
  }
  return { record, outcome };
}

/** Publishes an accepted call on its tool's work subject, which arms its deadline. */
async function publishWork(
  route: Pick<Route, "deps" | "resolved" | "target" | "key" | "callLog"> & { seq: number },
  { record, outcome }: Accepted,
): Promise<void> {
  const { deps, resolved, target, seq, callLog } = route;
  const { plane, subjects } = deps;
  let routed: PubAck;
  try {
    // The record's revision goes along, so the executor need not read the record (ADR 0027),
    // and the deadline, which every resolver's deadline keeper reads as the work goes by (ADR 0028).
    // A tool owner's tool waits on its owner's work stream (ADR 0041).
    const definition = deps.registry.get(resolved.tool)?.definition;
    const owner = definition && workOwnerOf(definition);
    const known = knownRecordHeaders(record, outcome);
    // An owner's executor ends the call through the owner services, which must not take the
    // record from it: kept here, it spares them a read when this process answers.
    if (owner !== undefined && known !== undefined)
      plane.store.remember(resolved, { record, revision: outcome.revision });
    routed = await publishDurable(plane.js, subjects.work(resolved.tool, owner), resolved, {
      msgId: route.key,
      headers: deadlineHeaders(resolved, tracedHeaders(known)),
    });
  } catch (err) {
    const error = ensureError(err);
    if (error.retryable) throw err;
    // The record itself cannot be sent (defaults made it outgrow the limit): answer now.
    await plane.finalize(resolved, errorToolMessage(target, error, { attempts: 0 }));
    return;
  }
  if (routed.duplicate && outcome.status === "new") {
    if (await routedUnderRecord(plane.jsm, plane.store, resolved, routed, outcome.revision)) {
      callLog.info("call routed meanwhile by another delivery of it");
      return;
    }
    // The work stream remembers routing this key, but its record was gone (expired or
    // purged): the work was dropped as a duplicate and no executor will see it, nor will the
    // deadline keeper. Answer it from its stored result, or refuse it; never leave it waiting.
    await answerVanishedRecord(deps, resolved, target, seq, callLog);
    return;
  }
  callLog.debug(
    { missing_optional: resolved.missing_optional, seq: routed.seq, duplicate: routed.duplicate },
    "call routed to its executors",
  );
}

/** Holds a call for its fair turn at a busy tool: routed then, or answered at its deadline. */
function holdForTurn(route: Route, ticket: AdmissionTicket, work: () => Promise<void>): void {
  const { deps, resolved, target, msg, callLog } = route;
  ticket.hold(
    msg,
    async () => {
      await work();
      msg.ack();
    },
    async () => {
      await deps.plane.finalize(
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
  );
  callLog.debug("tool busy; call held for its fair turn");
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
  // Null when no final message is stored; a read that fails now hands the call back.
  const stored = await plane.jsm.streams.getMessage(subjects.streams.sessions, {
    last_by_subj: subject,
  });
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
    deliveryResultMsgId(callKey(resolved.address, resolved.idempotency_key), seq),
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
      msgId: missingArgumentsMsgId(callKey(address, idempotencyKeyOf(request, callId))),
    });
  }
  const message = errorToolMessage(
    {
      tool_call_id: callId,
      name: resolution.tool ?? "",
      session_id:
        request?.session_id ??
        (resolution.sessionId !== undefined &&
        subjectToken(resolution.sessionId) === address.session
          ? resolution.sessionId
          : address.session),
    },
    error,
    { attempts: 0 },
  );
  if (resolution.argsHash !== undefined) message.args_hash = resolution.argsHash;
  const key = callKey(
    address,
    request?.idempotency_key ?? `${request?.session_id ?? address.session}/${callId}`,
  );
  recordRefusal(
    deps,
    address.tenant,
    { call_id: callId, session: message.session_id, tool: resolution.tool },
    error,
    { key, seq },
  );
  await publishFinal(subjects.result(address, callId), message, invalidResultMsgId(key, seq));
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
      msgId: rejectedMsgId(key, seq),
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

/**
 * Routes a call once a person approved it (ADR 0059): accepted in the call store and published
 * on its tool's work subject, past admission (it was counted as it waited). A call that ended
 * meanwhile (cancelled) is left as it is. `seq` names the delivery for a vanished record's answer.
 */
export async function routeApproved(
  deps: ResolverDeps,
  resolved: ResolvedCall,
  argsHash: string,
  seq: number,
): Promise<void> {
  const callLog = lazyChild(deps.log, {
    callId: resolved.call_id,
    sessionId: resolved.address.session,
    tool: resolved.tool,
  });
  const record = callRecordOf(resolved, argsHash);
  const outcome = await deps.plane.store.accept(record);
  if (outcome.status === "conflict" || outcome.status === "done") {
    callLog.info({ status: outcome.status }, "approved call ended before it was routed");
    return;
  }
  // Admitted now that it was approved. Under `required` its work waits until the admission is
  // written (retried, never refused: the approval is recorded already), so the trail keeps the
  // call's order: admitted before its attempts.
  const admitted = deps.audit?.record(resolved.address.tenant, {
    ...auditIds(resolved),
    type: AuditEventType.Admitted,
    data: {
      args_hash: argsHash,
      ...deps.audit.argumentsOf(resolved.address.tenant, resolved.arguments),
      deadline_at: resolved.deadline_at,
      held: false,
    },
  });
  if (deps.audit?.required === true) await admitted;
  await publishWork(
    {
      deps,
      resolved,
      target: {
        tool_call_id: resolved.call_id,
        name: resolved.tool,
        session_id: resolved.session_id,
      },
      key: callKey(resolved.address, resolved.idempotency_key),
      callLog,
      seq,
    },
    { record, outcome },
  );
  callLog.info("approved call routed to its executors");
}
