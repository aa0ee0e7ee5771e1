import type { AuditEventInput, AuditTrail } from "@toolmesh/audit";
import { approvalDecided, approvalRequested, canonicalDigest } from "@toolmesh/audit";
import type { NatsConnection } from "@nats-io/nats-core";
import type { KV } from "@nats-io/kv";
import type { JetStreamManager } from "@nats-io/jetstream";
import { jetstreamManager } from "@nats-io/jetstream";
import type {
  ApprovalDecision,
  ApprovalEntry,
  ApprovalReply,
  ApprovalRequest,
  ApprovalRequiredEvent,
  CallDecision,
  CallRecord,
  ConfirmRequest,
  PendingApproval,
  ResolvedCall,
  SessionAddress,
  Subjects,
  ToolDefinition,
} from "@toolmesh/protocol";
import {
  ApprovalRequestSchema,
  ConfirmRequestSchema,
  ErrorCode,
  PendingApprovalSchema,
  ToolmeshError,
  callKey,
  decodeJsonOrUndefined,
  encodeJson,
  errorToolMessage,
  resultMsgId,
} from "@toolmesh/protocol";
import type { RequestServer, ScannedEntry } from "@toolmesh/nats";
import {
  isWrongLastSequence,
  meshPlan,
  openBucket,
  rpcTenantScope,
  scanBucket,
  serveRequests,
} from "@toolmesh/nats";
import { callRecordOf } from "@toolmesh/call-store";
import type { MeshCallPlane } from "@toolmesh/call-store";
import type { ToolRegistry } from "@toolmesh/registry";
import type { PolicyDecider, PolicyDecision } from "@toolmesh/policy";
import type { Logger, ToolmeshMetrics } from "@toolmesh/telemetry";

// Calls that wait for a person (ADR 0059). A permit annotated `@approval` makes the resolver
// keep the resolved call in the approvals bucket instead of routing it; a decision moves the
// entry by compare-and-set (one decision wins), and an approved call is then routed once, by
// whichever resolver decided it or, after a crash, by any resolver's sweep. The sweep also
// expires calls nobody decided in time, whichever resolvers were up when they ran out.

/** Routes an approved call to its tool's work (accept in the call store, publish the work). */
export type RouteApproved = (call: ResolvedCall, submittedArgsHash: string) => Promise<void>;

/** Options of {@link ApprovalDesk.open}. Durations in ms. */
export interface ApprovalDeskOptions {
  nc: NatsConnection;
  subjects: Subjects;
  plane: MeshCallPlane;
  registry: ToolRegistry;
  policies: PolicyDecider | undefined;
  log: Logger;
  metrics: ToolmeshMetrics;
  /** How long call records are kept: a call waits at most this long. Default 24 h. */
  callRetentionMs: number;
  /** Replicas of the approvals bucket when created. Default 1. */
  replicas?: number | undefined;
  /** How often waiting calls are swept (expiry, approved calls not yet routed), in ms. Default 1 000. */
  sweepMs?: number | undefined;
  /** The tenants' audit trails: each approval asked for and decided is recorded there. */
  audit?: AuditTrail | undefined;
}

/** What {@link ApprovalDesk.hold} did with a submitted call. */
export type HoldOutcome =
  /** Stored (or found) waiting: nothing to route now. */
  | { status: "waiting" }
  /** Decided before (approved, denied, expired): the call store answers it. */
  | { status: "decided" }
  /** The key names a waiting call with other arguments or another tool. */
  | { status: "conflict"; record: CallRecord };

/** The queue group of the resolvers' approval and confirm requests. */
const QUEUE = "toolmesh-resolver";

/** Keeps the calls that wait for approval and decides them. */
export class ApprovalDesk {
  readonly #kv: KV;
  readonly #jsm: JetStreamManager;
  readonly #o: ApprovalDeskOptions;
  #route: RouteApproved | undefined;
  #servers: RequestServer[] = [];
  #timer: NodeJS.Timeout | undefined;
  #sweeping: Promise<void> | undefined;
  #waiting = 0;

  private constructor(kv: KV, jsm: JetStreamManager, options: ApprovalDeskOptions) {
    this.#kv = kv;
    this.#jsm = jsm;
    this.#o = options;
    options.metrics.observeApprovalsWaiting(() => this.#waiting);
  }

  /** Opens (creating when missing) the approvals bucket. */
  static async open(options: ApprovalDeskOptions): Promise<ApprovalDesk> {
    const spec = meshPlan(options.subjects, {
      replicas: options.replicas,
      callRetentionMs: options.callRetentionMs,
    }).buckets.callApprovals;
    const jsm = await jetstreamManager(options.nc);
    const kv = await openBucket(options.nc, jsm, spec, { existing: "keep" });
    return new ApprovalDesk(kv, jsm, options);
  }

  /**
   * Serves approval and confirm requests and sweeps the bucket every `sweepMs`; `route` routes
   * an approved call.
   */
  start(route: RouteApproved): void {
    this.#route = route;
    const { nc, subjects, log } = this.#o;
    this.#servers = [
      serveRequests({
        nc,
        subject: subjects.allApprovalsRpc,
        queue: QUEUE,
        log,
        what: "approval request",
        scope: rpcTenantScope(subjects),
        maxRequestBytes: 8_192,
        handle: (body, _msg, tenant) => this.answer(tenant, ApprovalRequestSchema.parse(body)),
      }),
      serveRequests({
        nc,
        subject: subjects.allConfirm,
        queue: QUEUE,
        log,
        what: "confirm request",
        scope: (msg) => {
          const at = subjects.parseSessionSubject(msg.subject);
          if (at === undefined)
            throw new ToolmeshError(ErrorCode.InvalidRequest, "not a confirm subject");
          return at;
        },
        maxRequestBytes: 8_192,
        handle: (body, _msg, at) => this.confirm(at, ConfirmRequestSchema.parse(body)),
      }),
    ];
    const every = this.#o.sweepMs ?? 1_000;
    this.#timer = setInterval(() => {
      this.#sweeping ??= this.sweep()
        .catch((err: unknown) => log.warn({ err }, "approvals sweep failed; trying again"))
        .finally(() => (this.#sweeping = undefined));
    }, every);
    this.#timer.unref();
  }

  /** Stops serving and sweeping; waits for a sweep in progress. */
  async stop(graceMs?: number): Promise<void> {
    clearInterval(this.#timer);
    await Promise.all(this.#servers.map((s) => s.stop(graceMs)));
    await this.#sweeping;
  }

  /**
   * Keeps a call the policies let through only with a person's approval: stored `waiting` and
   * its session told, or — its key known already — the same waiting call (told again), a
   * call decided before, or a conflicting reuse of the key.
   */
  async hold(
    call: ResolvedCall,
    submittedArgsHash: string,
    decision: PolicyDecision & { approval: NonNullable<PolicyDecision["approval"]> },
    definition: ToolDefinition,
  ): Promise<HoldOutcome> {
    const key = callKey(call.address, call.idempotency_key);
    const now = this.#o.plane.clock.now();
    const ttlMs = Math.min(decision.approval.ttlMs, this.#o.callRetentionMs);
    const pending: PendingApproval = {
      call,
      submitted_args_hash: submittedArgsHash,
      mode: decision.approval.mode,
      binding: {
        tenant: call.address.tenant,
        ...(call.agent === undefined ? {} : { agent: call.agent }),
        tool: call.tool,
        tool_hash: canonicalDigest(definition),
        args_hash: canonicalDigest(call.arguments),
        policy_version: decision.version,
        policies: decision.approval.policies,
      },
      state: "waiting",
      requested_at: now,
      expires_at: now + ttlMs,
    };
    for (;;) {
      try {
        await this.#kv.create(key, encodeJson(pending));
        this.#waiting += 1;
        void this.#audit(
          pending,
          approvalRequested(
            auditNamed(pending, {
              approvers: [pending.mode],
              reason: `policies ${decision.approval.policies.join(", ")}`,
            }),
          ),
        );
        await this.#announce(pending);
        return { status: "waiting" };
      } catch (err) {
        if (!isWrongLastSequence(err)) throw err;
      }
      const found = await this.#read(key);
      if (found === undefined) continue; // gone meanwhile: store it again
      const { entry } = found;
      if (entry.submitted_args_hash !== submittedArgsHash || entry.call.tool !== call.tool)
        return {
          status: "conflict",
          record: callRecordOf(entry.call, entry.submitted_args_hash),
        };
      if (entry.state !== "waiting") return { status: "decided" };
      await this.#announce(entry);
      return { status: "waiting" };
    }
  }

  /** Answers an approver's (or the operator's) request for tenant `tenant`. */
  async answer(tenant: string, request: ApprovalRequest): Promise<ApprovalReply> {
    if (request.op === "list") return { ok: true, approvals: await this.list(tenant) };
    const found = await this.#find(tenant, request.call_id, request.session_id);
    const by = `approver:${tenant}${request.by === undefined ? "" : `/${request.by}`}`;
    return this.#decide(found.key, "operator", {
      effect: request.op,
      by,
      ...(request.reason === undefined ? {} : { reason: request.reason }),
    });
  }

  /**
   * The caller's confirmation (`confirm: true`) or refusal of one of its session's calls that
   * waits for the caller (`@approval("caller")`). What the gateway calls for a caller who
   * answered its `input_required`, too.
   */
  async confirm(at: SessionAddress, request: ConfirmRequest): Promise<ApprovalReply> {
    const key = callKey(
      at,
      request.idempotency_key ?? `${request.session_id}/${request.tool_call_id}`,
    );
    return this.#decide(key, "caller", {
      effect: request.confirm ? "approve" : "deny",
      by: "caller",
      ...(request.reason === undefined ? {} : { reason: request.reason }),
    });
  }

  /** The calls of `tenant` waiting for the operator's or its approver's decision. */
  async list(tenant: string): Promise<ApprovalEntry[]> {
    const entries: ApprovalEntry[] = [];
    for (const { entry } of await this.#entriesOf(tenant)) {
      if (entry.state !== "waiting" || entry.mode !== "operator") continue;
      entries.push(listed(entry));
    }
    return entries.sort((a, b) => a.requested_at - b.requested_at);
  }

  /**
   * How long an approved call is left to the resolver that decided it before a sweep routes it:
   * a sweep routes only calls whose routing a crash interrupted, so that the decision's audit
   * event, written by its decider before routing, comes first in the trail.
   */
  get #routeGraceMs(): number {
    return 5 * (this.#o.sweepMs ?? 1_000);
  }

  /**
   * One pass over the bucket: expires waiting calls past their time, routes approved calls
   * whose routing a crash interrupted, and counts those waiting.
   */
  async sweep(): Promise<void> {
    const now = this.#o.plane.clock.now();
    let waiting = 0;
    for (const { key, entry, revision } of await this.#scan()) {
      if (entry.state === "waiting" && now >= entry.expires_at) {
        await this.#expire(key, entry, revision, now).catch((err: unknown) =>
          this.#o.log.warn({ err, key }, "cannot expire a waiting call yet"),
        );
      } else if (entry.state === "waiting") {
        waiting += 1;
      } else if (
        entry.state === "approved" &&
        now - (entry.decision?.at ?? 0) >= this.#routeGraceMs
      ) {
        await this.#routeApproved(key, entry, revision);
      }
    }
    this.#waiting = waiting;
  }

  // ---- decisions ----

  async #decide(
    key: string,
    mode: PendingApproval["mode"],
    given: Omit<ApprovalDecision, "at">,
  ): Promise<ApprovalReply> {
    for (;;) {
      const found = await this.#read(key);
      // A call of another tenant or session is not found: its key is never reached.
      if (found === undefined || found.entry.mode !== mode)
        throw new ToolmeshError(
          ErrorCode.InvalidRequest,
          mode === "caller"
            ? "no call of this session waits for the caller's confirmation under that id"
            : "no call of this tenant waits for approval under that id",
          { retryable: false },
        );
      const { entry, revision } = found;
      const now = this.#o.plane.clock.now();
      if (entry.state !== "waiting") throw alreadyDecided(entry);
      if (now >= entry.expires_at) {
        await this.#expire(key, entry, revision, now);
        throw expiredError(entry);
      }
      const decision: ApprovalDecision = { ...given, at: now };
      const next: PendingApproval = {
        ...entry,
        state: given.effect === "approve" ? "approved" : "denied",
        decision,
      };
      try {
        await this.#kv.update(key, encodeJson(next), revision);
      } catch (err) {
        if (isWrongLastSequence(err)) continue; // decided meanwhile: read it again
        throw err;
      }
      await this.#decided(entry, decision);
      if (given.effect === "approve") await this.#routeApproved(key, next, revision + 1);
      else
        await this.#end(
          next,
          new ToolmeshError(
            ErrorCode.ApprovalDenied,
            `call ${entry.call.call_id} of tool "${entry.call.tool}" was denied${given.reason === undefined ? "" : `: ${given.reason}`}`,
            {
              retryable: false,
              details: {
                decided_by: decision.by,
                ...(given.reason === undefined ? {} : { reason: given.reason }),
              },
            },
          ),
        );
      return { ok: true, decided: { call_id: entry.call.call_id, state: next.state, decision } };
    }
  }

  async #expire(key: string, entry: PendingApproval, revision: number, now: number) {
    const decision: ApprovalDecision = { effect: "expire", by: "mesh", at: now };
    const next: PendingApproval = { ...entry, state: "expired", decision };
    try {
      await this.#kv.update(key, encodeJson(next), revision);
    } catch (err) {
      if (isWrongLastSequence(err)) return; // another resolver decided or expired it
      throw err;
    }
    await this.#decided(entry, decision);
    await this.#end(next, expiredError(entry));
  }

  /**
   * Routes an approved call once its grant still holds: the tool's definition and the policy
   * sets are those it was approved under. Its deadline counts from now. Then marks it routed.
   */
  async #routeApproved(key: string, entry: PendingApproval, revision: number): Promise<void> {
    const now = this.#o.plane.clock.now();
    const broken = this.#brokenGrant(entry);
    if (broken !== undefined) {
      await this.#end(entry, broken);
    } else {
      const route = this.#route;
      if (route === undefined) return;
      const call: ResolvedCall = {
        ...entry.call,
        resolved_at: now,
        deadline_at: now + entry.call.timeout_ms,
        decision: recordedDecision(entry),
      };
      await route(call, entry.submitted_args_hash);
    }
    try {
      await this.#kv.update(key, encodeJson({ ...entry, state: "routed" }), revision);
    } catch (err) {
      // Another resolver's sweep routed it too: the call store and the work's message id kept
      // it to one run.
      if (!isWrongLastSequence(err)) throw err;
    }
  }

  /** Why an approval no longer holds for its call, or undefined. */
  #brokenGrant(entry: PendingApproval): ToolmeshError | undefined {
    const definition = this.#o.registry.get(entry.call.tool)?.definition;
    if (definition === undefined || canonicalDigest(definition) !== entry.binding.tool_hash)
      return new ToolmeshError(
        ErrorCode.ApprovalExpired,
        `call ${entry.call.call_id} was approved for a definition of tool "${entry.call.tool}" that changed since: submit it again`,
        { retryable: false, details: { reason: "tool_changed" } },
      );
    const now = this.#o.policies?.decideCall(entry.call, definition);
    if (now !== undefined && !now.allowed)
      return new ToolmeshError(
        ErrorCode.PermissionDenied,
        `call ${entry.call.call_id} of tool "${entry.call.tool}" is no longer allowed by the policies in force`,
        { retryable: false, details: { policies: now.policies, policy_version: now.version } },
      );
    if (now !== undefined && now.version !== entry.binding.policy_version)
      return new ToolmeshError(
        ErrorCode.ApprovalExpired,
        `call ${entry.call.call_id} was approved under policy version ${entry.binding.policy_version}, now ${now.version}: submit it again`,
        { retryable: false, details: { reason: "policy_changed" } },
      );
    return undefined;
  }

  /** Ends a call that will not run: its record done with `error`, its session told. */
  async #end(entry: PendingApproval, error: ToolmeshError): Promise<void> {
    const { plane, subjects } = this.#o;
    const call = { ...entry.call, decision: recordedDecision(entry) };
    const record = callRecordOf(call, entry.submitted_args_hash);
    const accepted = await plane.store.accept(record);
    if (accepted.status === "done" || accepted.status === "conflict") return; // ended before
    const message = errorToolMessage(
      { tool_call_id: call.call_id, name: call.tool, session_id: call.session_id },
      error,
      { attempts: 0 },
    );
    const finished = await plane.store.finish(call, message);
    await plane.publishFinal(
      subjects.result(call.address, call.call_id),
      finished?.result ?? message,
      resultMsgId(callKey(call.address, call.idempotency_key)),
    );
  }

  /**
   * Records the decision (log, metrics, audit). Resolves once its audit event is written when
   * admissions must be recorded, so that the trail shows the decision before what follows it.
   */
  #decided(entry: PendingApproval, decision: ApprovalDecision): Promise<void> {
    const written = this.#audit(
      entry,
      approvalDecided(
        auditNamed(entry, {
          decision: decision.effect === "approve" ? "approved" : "denied",
          by: decision.by,
          reason: decision.reason ?? (decision.effect === "expire" ? "expired" : undefined),
        }),
      ),
    );
    this.#o.metrics.approvalDecided(
      decision.effect,
      Math.max(0, decision.at - entry.requested_at) / 1000,
    );
    this.#o.log.info(
      {
        callId: entry.call.call_id,
        tool: entry.call.tool,
        effect: decision.effect,
        by: decision.by,
        reason: decision.reason,
      },
      "waiting call decided",
    );
    return this.#o.audit?.required === true ? written : Promise.resolve();
  }

  /** Records `event` in the call's tenant's audit trail; resolves when it is written. */
  #audit(entry: PendingApproval, event: AuditEventInput): Promise<void> {
    return this.#o.audit?.record(entry.call.address.tenant, event) ?? Promise.resolve();
  }

  // ---- the bucket ----

  async #announce(entry: PendingApproval): Promise<void> {
    const { call } = entry;
    const event: ApprovalRequiredEvent = {
      tool_call_id: call.call_id,
      session_id: call.session_id,
      tool: call.tool,
      mode: entry.mode,
      requested_at: entry.requested_at,
      expires_at: entry.expires_at,
      policies: entry.binding.policies,
    };
    this.#o.nc.publish(
      this.#o.subjects.approvalRequired(call.address, call.call_id),
      encodeJson(event),
    );
    await this.#o.nc.flush();
  }

  async #read(key: string): Promise<{ entry: PendingApproval; revision: number } | undefined> {
    const got = await this.#kv.get(key);
    if (got === null || got.operation !== "PUT") return undefined;
    return this.#parse({ key, value: got.value, revision: got.revision });
  }

  #parse(
    scanned: Omit<ScannedEntry, "created">,
  ): { key: string; entry: PendingApproval; revision: number } | undefined {
    const parsed = PendingApprovalSchema.safeParse(decodeJsonOrUndefined(scanned.value));
    if (!parsed.success) {
      this.#o.log.warn(
        { key: scanned.key },
        "approvals bucket holds an entry of another shape; ignored",
      );
      return undefined;
    }
    return { key: scanned.key, entry: parsed.data, revision: scanned.revision };
  }

  /**
   * The waiting and decided calls under `filter` (all: undefined), read without a consumer
   * ({@link scanBucket}); an entry of another shape is left out.
   */
  async #scan(
    filter?: string,
  ): Promise<{ key: string; entry: PendingApproval; revision: number }[]> {
    const scanned = await scanBucket(this.#jsm, this.#o.subjects.callApprovalsBucket, filter);
    return scanned.flatMap((found) => this.#parse(found) ?? []);
  }

  #entriesOf(tenant: string): Promise<{ key: string; entry: PendingApproval }[]> {
    return this.#scan(`${tenant}.>`);
  }

  async #find(
    tenant: string,
    callId: string,
    sessionId: string | undefined,
  ): Promise<{ key: string; entry: PendingApproval }> {
    const matches = (await this.#entriesOf(tenant)).filter(
      ({ entry }) =>
        entry.call.call_id === callId &&
        entry.mode === "operator" &&
        (sessionId === undefined || entry.call.session_id === sessionId),
    );
    const first = matches[0];
    if (first === undefined)
      throw new ToolmeshError(
        ErrorCode.InvalidRequest,
        `no call "${callId}" of this tenant waits for approval`,
        { retryable: false, details: { call_id: callId } },
      );
    if (matches.length > 1)
      throw new ToolmeshError(
        ErrorCode.InvalidRequest,
        `call id "${callId}" waits in ${matches.length} sessions: name one with --session`,
        {
          retryable: false,
          details: { call_id: callId, sessions: matches.map((m) => m.entry.call.session_id) },
        },
      );
    return first;
  }
}

/** The decision kept with the call's record. */
function recordedDecision(entry: PendingApproval): CallDecision {
  return {
    effect: "approval",
    // Every policy that decided it; the permits that asked for approval are among them.
    policies: entry.call.decision?.policies ?? entry.binding.policies,
    policy_version: entry.binding.policy_version,
    ...(entry.decision === undefined
      ? {}
      : {
          approval: {
            mode: entry.mode,
            effect: entry.decision.effect,
            by: entry.decision.by,
            ...(entry.decision.reason === undefined ? {} : { reason: entry.decision.reason }),
            requested_at: entry.requested_at,
            at: entry.decision.at,
          },
        }),
  };
}

function listed(entry: PendingApproval): ApprovalEntry {
  const { call } = entry;
  return {
    call_id: call.call_id,
    tenant: call.address.tenant,
    session: call.session_id,
    idempotency_key: call.idempotency_key,
    tool: call.tool,
    args: call.arguments,
    ...(call.agent === undefined ? {} : { agent: call.agent }),
    mode: entry.mode,
    policies: entry.binding.policies,
    policy_version: entry.binding.policy_version,
    requested_at: entry.requested_at,
    expires_at: entry.expires_at,
  };
}

function expiredError(entry: PendingApproval): ToolmeshError {
  return new ToolmeshError(
    ErrorCode.ApprovalExpired,
    `call ${entry.call.call_id} of tool "${entry.call.tool}" waited for approval until ${new Date(entry.expires_at).toISOString()} and nobody decided it: submit it again under a new idempotency key`,
    { retryable: false, details: { expires_at: entry.expires_at } },
  );
}

/** A decision on a call decided before: refused, a decision counts once. */
function alreadyDecided(entry: PendingApproval): ToolmeshError {
  return new ToolmeshError(
    ErrorCode.InvalidRequest,
    `call ${entry.call.call_id} was decided before (${entry.state}${entry.decision === undefined ? "" : ` by ${entry.decision.by}`}): a decision counts once`,
    {
      retryable: false,
      details: {
        state: entry.state,
        ...(entry.decision === undefined ? {} : { decision: entry.decision }),
      },
    },
  );
}

/** A waiting call's names in its audit events, with `data`. */
function auditNamed<T extends object>(
  entry: PendingApproval,
  data: T,
): T & { call_id: string; session: string; tool: string } {
  const { call } = entry;
  return { call_id: call.call_id, session: call.session_id, tool: call.tool, ...data };
}
