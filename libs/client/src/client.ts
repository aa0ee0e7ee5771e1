import { hash, randomUUID } from "node:crypto";
import type { Msg, MsgHdrs, NatsConnection, Subscription } from "@nats-io/nats-core";
import type { JetStreamClient } from "@nats-io/jetstream";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import type {
  CancelReply,
  CancelRequest,
  CallRequest,
  CallerIdentity,
  CatalogReply,
  CatalogRequest,
  GroupState,
  ProgressEvent,
  Rejection,
  ResolveReply,
  SchemaEvent,
  SessionAddress,
  Subjects,
  ToolCall,
  ToolMessage,
  ToolSchema,
  WireError,
  ApprovalReply,
  ApprovalRequiredEvent,
  ConfirmRequest,
} from "@toolmesh/protocol";
import {
  ApprovalReplySchema,
  ApprovalRequiredEventSchema,
  CallRequestSchema,
  CancelReplySchema,
  CatalogReplySchema,
  Defaults,
  DescribeReplySchema,
  ErrorCode,
  ExpandReplySchema,
  GroupsReplySchema,
  MAX_ARGUMENT_DEPTH,
  ProgressEventSchema,
  RejectionSchema,
  ResolveReplySchema,
  SchemaEventSchema,
  ToolMessageSchema,
  ToolmeshError,
  createSubjects,
  decodeJson,
  decodeJsonOrUndefined,
  contextDepthError,
  ensureError,
  errorToolMessage,
  nestsDeeperThan,
  argumentsHash,
} from "@toolmesh/protocol";
import { failUnsentRequests, publishDurable, requestReply, tracedHeaders } from "@toolmesh/nats";
import type { SpanContext, Tracer } from "@toolmesh/telemetry";
import { linkableContext, withSpan } from "@toolmesh/telemetry";
import { trace } from "@opentelemetry/api";
import { recordReceipt, sendSpanOptions } from "./call-spans.js";
import { eventsDenied } from "./denied.js";
import type { z } from "zod";
import type { GroupChanges } from "./expansion.js";
import { SchemaInbox, readCatalog, requestSchemaExpander } from "./expansion.js";
import type { CatalogEntry } from "./formats/catalog.js";
import type { SupplementedSchema } from "./formats/supplemented.js";

/** How long a tenant's calls stream, looked up for `tenantStream`, is taken to exist, in ms. */
const STREAM_FOUND_MS = 60_000;
/**
 * How long it is taken not to exist, in ms: briefly, so a tenant's stream made while the client
 * runs (`toolmesh setup --tenants`) takes its calls within seconds.
 */
const STREAM_MISSING_MS = 5_000;
/**
 * After a reconnect, waiting calls look up their stored answers at once and again after these
 * delays, in ms: an answer published on another server of a cluster before this connection's
 * subscription reached it goes to nobody live, and a replica that serves the look-up may not
 * hold it yet (a restarted server catching up).
 */
const CATCH_UP_AGAIN_MS = [1_000, 5_000];
/** A look-up that failed (no stream leader yet, a timeout) is tried again after this, doubling. */
const LOOKUP_RETRY_MS = { first: 250, max: 2_000 };

/** Options of {@link ToolmeshClient}. Durations in ms. */
export interface ClientOptions {
  /** Subject prefix. Default `toolmesh`. */
  prefix?: string;
  /** This frontend's tenant id. Default `default`. */
  tenant?: string;
  /** Budget of a call that sets none, in ms. Default 60 000. */
  defaultTimeoutMs?: number;
  /** Extra wait past a call's deadline before the client answers it itself, in ms. Default 2 000. */
  deadlineGraceMs?: number;
  /**
   * How long request-reply exchanges (dry runs, cancellations, reads of stored answers) wait,
   * in ms. Default 5 000.
   */
  requestTimeoutMs?: number;
  /** Tracer for the call spans; default the global tracer named `toolmesh-client`. */
  tracer?: Tracer;
  /**
   * Follow every session through one subscription to the tenant's session events
   * (`{p}.v1.sessions.{tenant}.*.>`), each message handed to its session in-process, instead of
   * one subscription per session. For a process that opens a session per call, such as the MCP
   * gateway: the server then subscribes and unsubscribes nothing per call. It needs the right to
   * subscribe to every session of the tenant, and it receives the events of every session of the
   * tenant, this process's or not. Default false.
   */
  tenantSubscription?: boolean;
  /**
   * Store calls in the tenant's own calls stream (`{p}.v1.tenant-calls.{tenant}.{session}`,
   * ADR 0048) when it has one, as the calls of a tenant account are: for a process in the mesh
   * account that publishes for tenants, such as the MCP gateway, so they count against the
   * tenant's bound like its own frontends' calls. Whether the tenant has one is looked up (a
   * stream listing, `$JS.API.STREAM.NAMES`) at most once a minute while it has one, every 5 s
   * while it has none; without one, calls go to the mesh's calls stream. Default false.
   */
  tenantStream?: boolean;
}

/** A tool call as a frontend hands it over: OpenAI's shape, or just a name and arguments. */
export type CallInput =
  ToolCall | { id?: string; name: string; arguments?: string | Record<string, unknown> };

/** Per-call options. Durations in ms. */
export interface SubmitOptions {
  /** The call's whole budget, in ms. */
  timeoutMs?: number;
  /** Lowers the tool's per-attempt timeout for this call, in ms. */
  attemptTimeoutMs?: number;
  idempotencyKey?: string;
  /** Call-level execution context. */
  context?: Record<string, unknown>;
  /** Agent-level execution context. */
  agentContext?: Record<string, unknown>;
  agent?: string;
  /**
   * Who the call acts for. The resolver refuses (`permission_denied`) an identity whose tenant
   * is not the tenant the call is submitted in. Never put a token here.
   */
  identity?: CallerIdentity;
  /** Params connected by a workflow edge. */
  edgeParams?: string[];
}

/** Something that happened on a session. */
export type SessionEvent =
  | { type: "result"; message: ToolMessage }
  | { type: "progress"; event: ProgressEvent }
  /** A submission refused without touching the call its key names (`idempotency_conflict`). */
  | { type: "rejected"; rejection: Rejection }
  /**
   * A call was accepted and waits for a person (`awaiting_approval`): the operator's or the
   * tenant's approver's decision, or, with `mode: "caller"`, this session's
   * {@link Session.confirm}. Its final message comes once decided or expired.
   */
  | { type: "approval"; event: ApprovalRequiredEvent }
  | {
      type: "schema";
      tool: string;
      body: unknown;
      /** The body parsed; absent when it is not a valid schema event. */
      schema?: SchemaEvent;
    };

/**
 * A catalog as the schema expander gives it (`docs/protocol.md`, "CatalogRequest and
 * CatalogReply"): compact entries, expanded ones for tools whose schema the session already has,
 * the agent and its `output_strategy` when one applies, and `unavailable` tools of the agent.
 */
export type Catalog = Extract<CatalogReply, { ok: true }>;

/** One submitted call. */
export interface CallHandle {
  readonly callId: string;
  readonly tool: string;
  /** The one final message: a result or a typed error. Never rejects. */
  readonly result: Promise<ToolMessage>;
  /** Asks the mesh to cancel this call. */
  cancel(): Promise<CancelReply>;
}

/** The frontend side of toolmesh: build once per process, open a session per conversation. */
export class ToolmeshClient {
  readonly nc: NatsConnection;
  readonly subjects: Subjects;
  readonly tenant: string;
  readonly js: JetStreamClient;
  readonly #options: SessionOptions;
  readonly #tenantSubscription: boolean;
  // With `tenantSubscription`: the one subscription, and the open sessions by session token.
  #tenantSub: Subscription | undefined;
  readonly #routes = new Map<string, Set<(msg: Msg) => void>>();
  // The sessions told when the tenant's subscription is refused, and the refusal once it was.
  readonly #onTenantDenied = new Set<(err: ToolmeshError) => void>();
  #tenantDenied: ToolmeshError | undefined;
  readonly #tenantStream: boolean;
  // With `tenantStream`: whether the tenant has a calls stream, and until when that holds.
  #streamLookup: { until: number; has: Promise<boolean> } | undefined;

  constructor(nc: NatsConnection, options: ClientOptions = {}) {
    this.nc = nc;
    this.subjects = createSubjects(options.prefix === undefined ? {} : { prefix: options.prefix });
    this.tenant = options.tenant ?? Defaults.tenant;
    this.js = jetstream(nc);
    this.#options = {
      defaultTimeoutMs: options.defaultTimeoutMs ?? Defaults.callTimeoutMs,
      deadlineGraceMs: options.deadlineGraceMs ?? Defaults.deadlineGraceMs,
      requestTimeoutMs: options.requestTimeoutMs ?? Defaults.requestTimeoutMs,
      tracer: options.tracer ?? trace.getTracer("toolmesh-client"),
    };
    this.#tenantSubscription = options.tenantSubscription ?? false;
    this.#tenantStream = options.tenantStream ?? false;
    // A submission made while the connection was down was never sent (nats.js discards what
    // was written then): it fails once the connection is back and is published again at once,
    // not after its attempt's timeout. Only this tenant's calls: the connection is the user's.
    failUnsentRequests(
      nc,
      // `{p}.v1.calls.{t}.` and `{p}.v1.tenant-calls.{t}.`: the wildcards without their last `*`.
      [this.subjects.tenantCalls(this.tenant), this.subjects.tenantStreamCalls(this.tenant)].map(
        (wildcard) => wildcard.slice(0, -1),
      ),
    );
    // Final messages published while the connection was down never reach the live
    // subscription; they are in the sessions stream, so pending calls look them up there.
    void (async () => {
      for await (const status of nc.status()) {
        if (status.type === "reconnect") for (const session of this.#sessions) session.catchUp();
      }
    })();
  }

  readonly #sessions = new Set<Session>();

  /**
   * @internal Where a call of the session at `at` is published: the tenant's own calls stream's
   * subject when `tenantStream` is set and the tenant has one, else {@link Subjects.call}.
   */
  async callSubject(at: SessionAddress): Promise<string> {
    if (!this.#tenantStream) return this.subjects.call(at);
    const now = Date.now();
    if (this.#streamLookup === undefined || now >= this.#streamLookup.until) {
      const before = this.#streamLookup?.has ?? Promise.resolve(false);
      const lookup = {
        // Not looked up again while the answer is on its way.
        until: Number.POSITIVE_INFINITY,
        has: this.#hasTenantStream()
          .catch(() => before)
          .then((has) => {
            lookup.until = now + (has ? STREAM_FOUND_MS : STREAM_MISSING_MS);
            return has;
          }),
      };
      this.#streamLookup = lookup;
    }
    return (await this.#streamLookup.has)
      ? this.subjects.tenantStreamCall(at)
      : this.subjects.call(at);
  }

  async #hasTenantStream(): Promise<boolean> {
    const jsm = await jetstreamManager(this.nc, { checkAPI: false });
    for await (const name of jsm.streams.names(this.subjects.tenantStreamCalls(this.tenant)))
      if (name === this.subjects.callsStream(this.tenant)) return true;
    return false;
  }

  /**
   * @internal Hands the events of the session at `at` to `onMessage` until the returned
   * subscription is unsubscribed: its own subscription, or its route from the tenant's.
   * `onDenied` hears once that NATS refused this connection those events.
   */
  follow(
    at: SessionAddress,
    onMessage: (msg: Msg) => void,
    onDenied: (err: ToolmeshError) => void,
  ): Pick<Subscription, "unsubscribe"> {
    if (!this.#tenantSubscription) {
      const subject = this.subjects.sessionEvents(at);
      return this.nc.subscribe(subject, {
        callback: (err, msg) => {
          if (err === null) onMessage(msg);
          else {
            const denied = eventsDenied(err, subject, this.tenant);
            if (denied !== undefined) onDenied(denied);
          }
        },
      });
    }
    if (this.#tenantDenied !== undefined) {
      const denied = this.#tenantDenied;
      queueMicrotask(() => onDenied(denied));
      return { unsubscribe: () => undefined };
    }
    this.#onTenantDenied.add(onDenied);
    if (this.#tenantSub === undefined) {
      const subject = this.subjects.tenantEvents(this.tenant);
      this.#tenantSub = this.nc.subscribe(subject, {
        callback: (err, msg) => {
          if (err === null) this.#route(msg);
          else this.#deniedTenant(eventsDenied(err, subject, this.tenant));
        },
      });
    }
    let routes = this.#routes.get(at.session);
    if (routes === undefined) {
      routes = new Set();
      this.#routes.set(at.session, routes);
    }
    routes.add(onMessage);
    return {
      unsubscribe: () => {
        this.#onTenantDenied.delete(onDenied);
        routes.delete(onMessage);
        if (routes.size === 0 && this.#routes.get(at.session) === routes)
          this.#routes.delete(at.session);
      },
    };
  }

  /** The tenant's subscription was refused: every session following it, and each to come, hears. */
  #deniedTenant(denied: ToolmeshError | undefined): void {
    if (denied === undefined) return;
    this.#tenantDenied = denied;
    for (const onDenied of this.#onTenantDenied) onDenied(denied);
    this.#onTenantDenied.clear();
  }

  #route(msg: Msg): void {
    const session = this.subjects.sessionOfEvent(msg.subject);
    const routes = session === undefined ? undefined : this.#routes.get(session);
    if (routes === undefined) return; // a session of the tenant this process does not follow
    for (const route of routes) {
      // A throw out of a subscription callback would stop the connection's reader, and one
      // session's listener must not keep the message from another session of the same id.
      try {
        route(msg);
      } catch {
        // the listener's own failure; the route goes on
      }
    }
  }

  /**
   * Opens a session: one subscription that carries every answer for it (with
   * `tenantSubscription`, the tenant's one subscription, routed to it).
   */
  session(sessionId: string): Session {
    const session = new Session(this, sessionId, this.#options, () =>
      this.#sessions.delete(session),
    );
    this.#sessions.add(session);
    return session;
  }

  /** Resolves a call without executing it: the resolved-call record, or the typed error. */
  async resolve(
    sessionId: string,
    call: CallInput,
    options: SubmitOptions = {},
  ): Promise<ResolveReply> {
    const request = buildRequest(sessionId, call, options);
    const problem = localProblem(request);
    if (problem !== undefined) return { ok: false, error: problem.toWire() };
    try {
      return await requestReply(
        this.nc,
        this.subjects.resolveRpc(this.tenant),
        request,
        ResolveReplySchema,
        { timeoutMs: this.#options.requestTimeoutMs, service: "resolver" },
      );
    } catch (err) {
      return { ok: false, error: ensureError(err, ErrorCode.Unavailable).toWire() };
    }
  }

  /**
   * The compact catalog without a session: every tool, or an agent's tools. Filtered by the
   * tenant's tool groups. Throws the typed error of a failed request (`unavailable` when no
   * schema expander runs). `names: "provider_safe"` gives each entry its provider-safe name
   * (`tool` keeps the mesh name); default `"mesh"`.
   */
  catalog(
    options: { agent?: string; identity?: CallerIdentity; names?: "mesh" | "provider_safe" } = {},
  ): Promise<Catalog> {
    return readCatalog((cursor) =>
      this.schemaRequest(
        this.subjects.catalogRpc(this.tenant),
        { ...options, ...(cursor === undefined ? {} : { cursor }) },
        CatalogReplySchema,
      ),
    );
  }

  /** Every tool group and whether it is active for the tenant's sessions. */
  async groups(): Promise<GroupState[]> {
    return this.setGroups({});
  }

  /**
   * Switches tool groups for every session of the tenant (a session's own switch still wins);
   * returns every group afterwards.
   */
  async setGroups(changes: GroupChanges): Promise<GroupState[]> {
    const reply = await this.schemaRequest(
      this.subjects.groupsRpc(this.tenant),
      changes,
      GroupsReplySchema,
    );
    return reply.groups;
  }

  /** @internal A request to the schema expander; used by sessions too. */
  schemaRequest<T extends { ok: true }>(
    subject: string,
    body: unknown,
    schema: z.ZodType<T | { ok: false; error: WireError }>,
  ): Promise<T> {
    return requestSchemaExpander(this.nc, subject, body, schema, this.#options.requestTimeoutMs);
  }
}

/** What a session takes from its client's options. */
type SessionOptions = Required<
  Omit<ClientOptions, "prefix" | "tenant" | "tracer" | "tenantSubscription" | "tenantStream">
> & { tracer: Tracer };

let generatedIds = 0;

function toToolCall(call: CallInput): ToolCall {
  if ("function" in call) return call;
  return {
    id: call.id ?? `call_${Date.now().toString(36)}_${(generatedIds++).toString(36)}`,
    type: "function",
    function: { name: call.name, arguments: call.arguments ?? {} },
  };
}

function buildRequest(sessionId: string, call: CallInput, options: SubmitOptions): CallRequest {
  return {
    tool_call: toToolCall(call),
    session_id: sessionId,
    ...(options.idempotencyKey === undefined ? {} : { idempotency_key: options.idempotencyKey }),
    ...(options.context === undefined ? {} : { context: options.context }),
    ...(options.agentContext === undefined ? {} : { agent_context: options.agentContext }),
    ...(options.agent === undefined ? {} : { agent: options.agent }),
    ...(options.identity === undefined ? {} : { identity: options.identity }),
    ...(options.timeoutMs === undefined ? {} : { timeout_ms: options.timeoutMs }),
    ...(options.edgeParams === undefined ? {} : { edge_params: options.edgeParams }),
    ...(options.attemptTimeoutMs === undefined
      ? {}
      : { attempt_timeout_ms: options.attemptTimeoutMs }),
  };
}

interface Pending {
  resolve(message: ToolMessage): void;
  timer: NodeJS.Timeout;
  /** Settles it with the local `deadline_exceeded`; `timer` calls it. */
  giveUp: () => void;
  /** Its budget, in ms: a call that waits for approval has it again once decided. */
  timeoutMs: number;
  /** The tool and `args_hash` of the submission: a final message for other ones is not its. */
  tool: string;
  argsHash: string;
  /** The call's `send` span, once started. */
  sent?: SpanContext | undefined;
}

/** A conversation's view of the mesh: submit calls, await their answers, watch its events. */
export class Session {
  readonly id: string;
  readonly address: SessionAddress;
  readonly #client: ToolmeshClient;
  readonly #options: SessionOptions;
  readonly #sub: Pick<Subscription, "unsubscribe">;
  readonly #pending = new Map<string, Pending>();
  readonly #listeners = new Set<(event: SessionEvent) => void>();
  readonly #onClose = new Set<() => void>();
  readonly #schemas = new SchemaInbox();
  // A digest of the final message delivered per call id, oldest first, to drop repeats: a
  // digest, not the message, so that remembering thousands of large results costs no more than
  // remembering small ones.
  readonly #finished = new Map<string, string>();
  // The calls-stream sequence of each waiting call's submission, and back: a rejection names it.
  readonly #seqOf = new Map<string, number>();
  readonly #callAt = new Map<number, string>();
  // Rejections that came before their submission's PubAck, by sequence, oldest first.
  readonly #earlyRejections = new Map<number, Rejection>();
  // The later passes of a catch-up after a reconnect.
  readonly #catchUpTimers = new Set<NodeJS.Timeout>();
  // Calls whose stored answer is being looked up.
  readonly #lookingUp = new Set<string>();
  readonly #onClosed: () => void;
  #closed = false;
  // Set when NATS refused this connection the session's events (see #eventsDenied).
  #denied: ToolmeshError | undefined;
  // Headers of the final message being delivered, for the receipt span (settled synchronously).
  #resultHeaders: MsgHdrs | undefined;

  constructor(
    client: ToolmeshClient,
    sessionId: string,
    options: SessionOptions,
    onClosed: () => void = () => undefined,
  ) {
    this.#client = client;
    this.#options = options;
    this.#onClosed = onClosed;
    this.id = sessionId;
    this.address = client.subjects.address(client.tenant, sessionId);
    this.#sub = client.follow(
      this.address,
      (msg) => this.#onMessage(msg),
      (err) => this.#eventsDenied(err),
    );
  }

  /**
   * Submits one call. The returned handle's `result` settles with the call's final message,
   * or with a local `deadline_exceeded` error when nothing arrives by the deadline plus grace.
   */
  submit(call: CallInput, options: SubmitOptions = {}): CallHandle {
    if (this.#closed) throw new ToolmeshError(ErrorCode.InvalidRequest, "session is closed");
    const request = buildRequest(this.id, call, options);
    const callId = request.tool_call.id;
    const tool = request.tool_call.function.name;
    const timeoutMs = request.timeout_ms ?? this.#options.defaultTimeoutMs;
    request.timeout_ms = timeoutMs;
    this.#finished.delete(callId); // submitted again: its answer is awaited again
    if (this.#pending.has(callId)) {
      throw new ToolmeshError(
        ErrorCode.InvalidRequest,
        `call ${callId} is already waiting in this session`,
      );
    }
    const result = new Promise<ToolMessage>((resolve) => {
      const deadline = Date.now() + timeoutMs;
      const giveUp = (): void => {
        this.#settle(
          callId,
          localError(
            callId,
            tool,
            this.id,
            new ToolmeshError(ErrorCode.DeadlineExceeded, `no answer within ${timeoutMs} ms`),
          ),
        );
      };
      const timer = setTimeout(
        giveUp,
        Math.min(timeoutMs + this.#options.deadlineGraceMs, MAX_TIMER_MS),
      );
      const problem = localProblem(request) ?? this.#denied;
      const pending: Pending = {
        resolve,
        timer,
        giveUp,
        timeoutMs,
        tool,
        // Arguments the mesh could not take are never hashed (they may nest too deep to).
        argsHash: problem === undefined ? argumentsHash(request.tool_call.function.arguments) : "",
      };
      this.#pending.set(callId, pending);
      if (problem !== undefined) {
        // Caught here: the mesh could not even tell which call to answer.
        this.#settle(callId, localError(callId, tool, this.id, problem));
        return;
      }
      const subject = this.#client.subjects.call(this.address);
      // One random id per submission: its own publish retries are dropped as duplicates, while
      // any other submission — a new call id under the same key, a conflicting reuse of the key,
      // a resubmission after a restart — reaches the resolver, which answers it from the call
      // store. Unguessable, so no other frontend can pre-empt it or learn it was used.
      const msgId = randomUUID();
      void withSpan(
        this.#options.tracer,
        "send",
        sendSpanOptions({
          subject,
          template: this.#client.subjects.call({ tenant: "{tenant}", session: "{session}" }),
          messageId: msgId,
          tool,
          callId,
          sessionId: this.id,
        }),
        (span) => {
          pending.sent = linkableContext(span);
          return this.#publish(request, deadline, msgId);
        },
      ).catch((err: unknown) => {
        this.#settle(
          callId,
          localError(callId, tool, this.id, ensureError(err, ErrorCode.Unavailable)),
        );
      });
    });
    return { callId, tool, result, cancel: () => this.cancel(callId, options.idempotencyKey) };
  }

  /**
   * Confirms (`confirm: true`) or declines one of this session's calls that waits for its
   * caller (`@approval("caller")`, announced by an `approval` event with `mode: "caller"`):
   * confirmed, it runs once, its deadline counting from now; declined, it ends with
   * `approval_denied`. A second answer is refused: a decision counts once. Never rejects.
   */
  async confirm(
    callId: string,
    confirm: boolean,
    options: { reason?: string; idempotencyKey?: string } = {},
  ): Promise<ApprovalReply> {
    const request: ConfirmRequest = {
      tool_call_id: callId,
      session_id: this.id,
      confirm,
      ...(options.idempotencyKey === undefined ? {} : { idempotency_key: options.idempotencyKey }),
      ...(options.reason === undefined ? {} : { reason: options.reason }),
    };
    try {
      return await requestReply(
        this.#client.nc,
        this.#client.subjects.confirm(this.address),
        request,
        ApprovalReplySchema,
        { timeoutMs: this.#options.requestTimeoutMs, service: "resolver" },
      );
    } catch (err) {
      return { ok: false, error: ensureError(err, ErrorCode.Unavailable).toWire() };
    }
  }

  /**
   * Asks the mesh to cancel a call: a queued call never starts, a running one is aborted,
   * and the session gets `cancelled` — unless the call had already ended.
   */
  async cancel(callId: string, idempotencyKey?: string): Promise<CancelReply> {
    const request: CancelRequest = {
      tool_call_id: callId,
      session_id: this.id,
      ...(idempotencyKey === undefined ? {} : { idempotency_key: idempotencyKey }),
    };
    try {
      return await requestReply(
        this.#client.nc,
        this.#client.subjects.cancel(this.address),
        request,
        CancelReplySchema,
        { timeoutMs: this.#options.requestTimeoutMs, service: "resolver" },
      );
    } catch (err) {
      return {
        cancelled: false,
        state: "unknown",
        error: ensureError(err, ErrorCode.Unavailable).toWire(),
      };
    }
  }

  /**
   * Publishes a call, retrying with the same message id while the server is unreachable
   * (restarts, failovers) and the deadline allows. A duplicate of an earlier submission is
   * answered from the stored result when there is one.
   */
  async #publish(request: CallRequest, deadline: number, msgId: string): Promise<void> {
    const callId = request.tool_call.id;
    // Retries stay close together (at most 500 ms apart): a stream without a leader answers
    // "no responders" at once while it elects one, and the call should be stored within half a
    // second of the new leader, not up to two.
    for (let delay = 100; ; delay = Math.min(delay * 2, 500)) {
      try {
        const ack = await publishDurable(
          this.#client.js,
          await this.#client.callSubject(this.address),
          request,
          {
            msgId,
            headers: tracedHeaders(),
            // Short attempts: while the server restarts, retry soon rather than wait 5 s.
            timeoutMs: Math.max(250, Math.min(2_000, deadline - Date.now())),
          },
        );
        this.#submitted(callId, ack.seq);
        if (ack.duplicate) void this.#lookUpStored(callId);
        return;
      } catch (err) {
        const error = ensureError(err, ErrorCode.Unavailable);
        if (!error.retryable || Date.now() + delay >= deadline || !this.#pending.has(callId))
          throw error;
        await new Promise((resolve) => setTimeout(resolve, delay));
      }
    }
  }

  /**
   * Catch-up: reads a waiting call's stored answers by direct get (what the shipped frontend
   * rights allow), in the order docs/protocol.md specifies — first the rejection of its own
   * submission (`rejected.{seq}`), then the last final message on its result subject, which
   * settles it only if it names the submission's tool and arguments (`args_hash`).
   */
  async #answerFromStore(callId: string): Promise<void> {
    const jsm = await jetstreamManager(this.#client.nc, {
      checkAPI: false,
      timeout: this.#options.requestTimeoutMs,
    });
    const { subjects } = this.#client;
    const seq = this.#seqOf.get(callId);
    // Direct get names the subject in the request subject, which permissions can confine.
    // Null only when the stream holds no such message; a failed read throws.
    const lastOn = (subject: string) =>
      jsm.direct.getMessage(subjects.streams.sessions, { last_by_subj: subject });
    if (seq !== undefined) {
      const rejected = await lastOn(subjects.rejected(this.address, seq));
      const refusal =
        rejected === null
          ? undefined
          : RejectionSchema.safeParse(decodeJsonOrUndefined(rejected.data));
      if (refusal?.success === true) this.#deliver({ type: "rejected", rejection: refusal.data });
    }
    if (!this.#pending.has(callId)) return;
    const stored = await lastOn(subjects.result(this.address, callId));
    if (stored === null) return; // still running: the answer will arrive live
    const parsed = ToolMessageSchema.safeParse(decodeJsonOrUndefined(stored.data));
    if (parsed.success) this.#deliver({ type: "result", message: parsed.data });
  }

  /**
   * {@link #answerFromStore}, tried again while it fails and the call still waits: a failed
   * read is no "not there", and the answer may be nowhere else. Never rejects.
   */
  async #lookUpStored(callId: string): Promise<void> {
    if (this.#lookingUp.has(callId)) return; // one look-up per call at a time
    this.#lookingUp.add(callId);
    try {
      await this.#lookUpUntilRead(callId);
    } finally {
      this.#lookingUp.delete(callId);
    }
  }

  async #lookUpUntilRead(callId: string): Promise<void> {
    for (let delay = LOOKUP_RETRY_MS.first; ; delay = Math.min(delay * 2, LOOKUP_RETRY_MS.max)) {
      if (!this.#pending.has(callId) || this.#closed) return;
      try {
        await this.#answerFromStore(callId);
        return;
      } catch {
        await new Promise((resolve) => setTimeout(resolve, delay));
      }
    }
  }

  /** Remembers which submission a waiting call is, and settles it if already rejected. */
  #submitted(callId: string, seq: number): void {
    if (!this.#pending.has(callId)) return;
    this.#seqOf.set(callId, seq);
    this.#callAt.set(seq, callId);
    const early = this.#earlyRejections.get(seq);
    if (early !== undefined) {
      this.#earlyRejections.delete(seq);
      this.#settle(callId, withoutSeq(early));
    }
  }

  /**
   * Submits a whole `tool_calls` array at once; the calls run in parallel. `results` keeps
   * the input order; iterate `settled` to get each message as it arrives.
   */
  submitAll(
    calls: readonly CallInput[],
    options: SubmitOptions = {},
  ): {
    handles: CallHandle[];
    results: Promise<ToolMessage[]>;
    settled: AsyncIterable<ToolMessage>;
  } {
    const handles = calls.map((call) => this.submit(call, options));
    const results = Promise.all(handles.map((h) => h.result));
    async function* settled(): AsyncGenerator<ToolMessage> {
      const racing = new Map(
        handles.map((h) => [h.callId, h.result.then((m) => ({ id: h.callId, m }))]),
      );
      while (racing.size > 0) {
        const { id, m } = await Promise.race(racing.values());
        racing.delete(id);
        yield m;
      }
    }
    return { handles, results, settled: settled() };
  }

  /** Listens to every event of the session; returns the function that stops listening. */
  onEvent(listener: (event: SessionEvent) => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  /** Iterates the session's events until `signal` aborts or the session closes. */
  async *events(signal?: AbortSignal): AsyncGenerator<SessionEvent> {
    const queue: SessionEvent[] = [];
    let wake: (() => void) | undefined;
    const stop = this.onEvent((e) => {
      queue.push(e);
      wake?.();
    });
    const onAbort = (): void => wake?.();
    signal?.addEventListener("abort", onAbort);
    this.#onClose.add(onAbort);
    try {
      while (!this.#closed && signal?.aborted !== true) {
        const next = queue.shift();
        if (next !== undefined) {
          yield next;
          continue;
        }
        await new Promise<void>((resolve) => {
          wake = resolve;
        });
        wake = undefined;
      }
    } finally {
      stop();
      signal?.removeEventListener("abort", onAbort);
      this.#onClose.delete(onAbort);
    }
  }

  /**
   * Looks up, in the sessions stream, the final messages of every call still waiting: at once
   * and again after {@link CATCH_UP_AGAIN_MS}.
   */
  catchUp(): void {
    const lookUpAll = (): void => {
      for (const callId of this.#pending.keys()) void this.#lookUpStored(callId);
    };
    lookUpAll();
    for (const delay of CATCH_UP_AGAIN_MS) {
      const timer = setTimeout(() => {
        this.#catchUpTimers.delete(timer);
        lookUpAll();
      }, delay);
      this.#catchUpTimers.add(timer);
    }
  }

  /**
   * NATS refused this connection the session's events: nothing will answer its calls, which
   * settle with `err` now, and so will the ones submitted after.
   */
  #eventsDenied(err: ToolmeshError): void {
    this.#denied = err;
    for (const [callId, pending] of this.#pending)
      this.#settle(callId, localError(callId, pending.tool, this.id, err));
  }

  /** Stops listening; calls still waiting settle with `cancelled`. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#onClosed();
    this.#sub.unsubscribe();
    for (const timer of this.#catchUpTimers) clearTimeout(timer);
    this.#catchUpTimers.clear();
    for (const [callId] of this.#pending) {
      this.#settle(
        callId,
        localError(
          callId,
          "",
          this.id,
          new ToolmeshError(ErrorCode.Cancelled, "session closed before the answer arrived"),
        ),
      );
    }
    for (const wake of this.#onClose) wake();
    this.#schemas.close();
  }

  // ---- Schema expansion, catalog and tool groups (the schema expander) ----

  /**
   * The compact catalog for this session: the tools it may call (its agent's, with an active
   * group), compact, except those whose schema it already received. `bindAgent` binds the
   * session to `agent` for good: from then on it may call only that agent's tools.
   * `names: "provider_safe"` gives each entry its provider-safe name (`tool` keeps the mesh
   * name, which calls name); default `"mesh"`.
   */
  catalog(
    options: { agent?: string; bindAgent?: boolean; names?: "mesh" | "provider_safe" } = {},
  ): Promise<Catalog> {
    const request: CatalogRequest = {
      session_id: this.id,
      ...(options.agent === undefined ? {} : { agent: options.agent }),
      ...(options.bindAgent === true ? { bind_agent: true } : {}),
      ...(options.names === undefined ? {} : { names: options.names }),
    };
    return readCatalog((cursor) =>
      this.#client.schemaRequest(
        this.#client.subjects.catalogRpc(this.#client.tenant),
        { ...request, ...(cursor === undefined ? {} : { cursor }) },
        CatalogReplySchema,
      ),
    );
  }

  /**
   * The full schemas of some tools, now; they count as sent to this session (no schema event
   * follows a later incomplete call) and join {@link Session.takeSupplementedSchemas}. Tools that
   * cannot be described (unknown, disabled, not the agent's) come back in `errors`.
   */
  async describe(
    tools: readonly string[],
    options: { agent?: string; identity?: CallerIdentity } = {},
  ): Promise<{ schemas: ToolSchema[]; errors: { tool: string; error: WireError }[] }> {
    const reply = await this.#client.schemaRequest(
      this.#client.subjects.describeRpc(this.#client.tenant),
      { session_id: this.id, tools, ...options },
      DescribeReplySchema,
    );
    this.#schemas.described(reply.schemas);
    return { schemas: reply.schemas, errors: reply.errors };
  }

  /** Asks for a tool's schema to be sent to this session again (a schema event follows). */
  async expand(tool: string, options: { agent?: string } = {}): Promise<ToolSchema> {
    const reply = await this.#client.schemaRequest(
      this.#client.subjects.expandRpc(this.#client.tenant),
      { session_id: this.id, tool, ...options },
      ExpandReplySchema,
    );
    return reply.schema;
  }

  /** Every tool group and whether it is active for this session. */
  groups(): Promise<GroupState[]> {
    return this.setGroups({});
  }

  /** Switches tool groups for this session only (winning over the tenant's switches). */
  async setGroups(changes: GroupChanges): Promise<GroupState[]> {
    const reply = await this.#client.schemaRequest(
      this.#client.subjects.groupsRpc(this.#client.tenant),
      { session_id: this.id, ...changes },
      GroupsReplySchema,
    );
    return reply.groups;
  }

  /**
   * Waits for a schema of `tool` that has not been taken yet: resolves at once with `true` if one
   * is pending, else when one arrives, or with `false` after `timeoutMs` (default 5 000).
   */
  async waitForSchema(tool: string, timeoutMs = 5_000): Promise<boolean> {
    if (this.#schemas.hasPending(tool)) return true;
    return (await this.#schemas.next(tool, timeoutMs)) !== undefined;
  }

  /**
   * The schemas received (events and `describe`) since the last call, for the next model turn;
   * feed them to `renderSupplementedSchemas`. Each is handed out once.
   */
  takeSupplementedSchemas(): SupplementedSchema[] {
    return this.#schemas.take();
  }

  /** The latest schema received for each tool. */
  receivedSchemas(): ReadonlyMap<string, ToolSchema> {
    return this.#schemas.latest();
  }

  /** `entries` with the tools whose schema this session received in their expanded form. */
  withReceivedSchemas<E extends CatalogEntry>(entries: readonly E[]): E[] {
    return this.#schemas.expand(entries);
  }

  #onMessage(msg: Msg): void {
    const kind = this.#client.subjects.sessionEventKind(msg.subject);
    let event: SessionEvent;
    try {
      const body = decodeJson(msg.data);
      if (kind === "result") event = { type: "result", message: ToolMessageSchema.parse(body) };
      else if (kind === "progress")
        event = { type: "progress", event: ProgressEventSchema.parse(body) };
      else if (kind === "rejected")
        event = { type: "rejected", rejection: RejectionSchema.parse(body) };
      else if (kind === "approval")
        event = { type: "approval", event: ApprovalRequiredEventSchema.parse(body) };
      else if (kind === "schema") {
        const schema = SchemaEventSchema.safeParse(body);
        event = { type: "schema", tool: (body as { tool?: string }).tool ?? "", body };
        if (schema.success) {
          event.schema = schema.data;
          this.#schemas.received(schema.data);
        }
      } else return;
    } catch {
      return; // Not ours to understand; the session goes on.
    }
    // Within a tenant's account the server delivers a JetStream answer to whatever reply subject
    // the requester named, so one frontend of the tenant can place another session's stored
    // message on this session's subjects: a final message or progress naming another session,
    // or a result whose subject names another call, is not this session's.
    if (
      (event.type === "result" &&
        (event.message.session_id !== this.id ||
          msg.subject !==
            this.#client.subjects.result(this.address, event.message.tool_call_id))) ||
      (event.type === "rejected" && event.rejection.session_id !== this.id) ||
      (event.type === "approval" && event.event.session_id !== this.id) ||
      (event.type === "progress" && event.event.session_id !== this.id)
    ) {
      return;
    }
    this.#resultHeaders = msg.headers;
    try {
      this.#deliver(event);
    } finally {
      this.#resultHeaders = undefined;
    }
  }

  /**
   * Settles the call a final message answers and tells the listeners. The same final
   * message can arrive twice (live, and again from the stream after a reconnect): a repeat is
   * dropped. A different final message for the same call (an operator's replay) is not.
   */
  #deliver(event: SessionEvent): void {
    if (event.type === "result") {
      const callId = event.message.tool_call_id;
      const digest = hash("sha256", JSON.stringify(event.message), "base64");
      if (this.#finished.get(callId) === digest) return;
      this.#finished.delete(callId);
      this.#finished.set(callId, digest);
      if (this.#finished.size > FINISHED_REMEMBERED) {
        this.#finished.delete(this.#finished.keys().next().value as string);
      }
      if (answers(this.#pending.get(callId), event.message)) this.#settle(callId, event.message);
    } else if (event.type === "approval") {
      // It waits for a person: its deadline starts once decided, by its expiry at the latest.
      const pending = this.#pending.get(event.event.tool_call_id);
      if (pending !== undefined) {
        clearTimeout(pending.timer);
        const wait = Math.max(0, event.event.expires_at - Date.now());
        pending.timer = setTimeout(
          pending.giveUp,
          Math.min(wait + pending.timeoutMs + this.#options.deadlineGraceMs, MAX_TIMER_MS),
        );
      }
    } else if (event.type === "rejected") {
      // Settles only the submission it names: the call its key names keeps its own answer.
      const { seq } = event.rejection;
      const callId = this.#callAt.get(seq);
      if (callId !== undefined) this.#settle(callId, withoutSeq(event.rejection));
      else {
        this.#earlyRejections.set(seq, event.rejection);
        if (this.#earlyRejections.size > EARLY_REJECTIONS_REMEMBERED) {
          this.#earlyRejections.delete(this.#earlyRejections.keys().next().value as number);
        }
      }
    }
    for (const listener of this.#listeners) listener(event);
  }

  #settle(callId: string, message: ToolMessage): void {
    const pending = this.#pending.get(callId);
    if (pending === undefined) return;
    this.#pending.delete(callId);
    const seq = this.#seqOf.get(callId);
    if (seq !== undefined) {
      this.#seqOf.delete(callId);
      this.#callAt.delete(seq);
    }
    clearTimeout(pending.timer);
    recordReceipt(this.#options.tracer, message, pending.sent, this.#resultHeaders);
    pending.resolve(message);
  }
}

function localError(
  callId: string,
  tool: string,
  sessionId: string,
  error: ToolmeshError,
): ToolMessage {
  return errorToolMessage({ tool_call_id: callId, name: tool, session_id: sessionId }, error, {
    attempts: 0,
  });
}

/**
 * Whether a final message for the waiting call's id answers its own submission: a message that
 * names other arguments or another tool (`args_hash`) ended a call that reused the id, and the
 * submission gets its own Rejection instead. A message without `args_hash` answers it.
 */
function answers(pending: Pending | undefined, message: ToolMessage): boolean {
  if (pending === undefined || message.args_hash === undefined) return true;
  return message.args_hash === pending.argsHash && message.name === pending.tool;
}

/** A rejection as the final message of the submission it names. */
function withoutSeq(rejection: Rejection): ToolMessage {
  const { seq: _seq, ...message } = rejection;
  return message;
}

// Rejections kept while their submission's PubAck is on its way.
const EARLY_REJECTIONS_REMEMBERED = 256;

// How many finished call ids a session remembers (a digest of each final message) to drop repeats.
const FINISHED_REMEMBERED = 4_096;

// Node timers hold at most 2^31 - 1 ms; a longer wait would fire at once.
const MAX_TIMER_MS = 2_147_483_647;

/** Why a request cannot be sent at all, in the resolver's own terms; undefined when it can. */
function localProblem(request: CallRequest): ToolmeshError | undefined {
  const args = request.tool_call.function.arguments;
  if (typeof args === "object" && args !== null && nestsDeeperThan(args, MAX_ARGUMENT_DEPTH)) {
    return new ToolmeshError(
      ErrorCode.InvalidArguments,
      `function.arguments nest deeper than ${MAX_ARGUMENT_DEPTH} levels`,
      {
        details: { max_depth: MAX_ARGUMENT_DEPTH },
      },
    );
  }
  const checked = CallRequestSchema.safeParse(request);
  if (checked.success) return contextDepthError(request);
  const issues = checked.error.issues.map((i) => ({
    path: `/${i.path.join("/")}`,
    message: i.message,
  }));
  const onlyArguments = issues.every((i) => i.path === "/tool_call/function/arguments");
  return onlyArguments
    ? new ToolmeshError(
        ErrorCode.InvalidArguments,
        "function.arguments must be a JSON object or a string holding one",
        {
          details: { issues },
        },
      )
    : new ToolmeshError(
        ErrorCode.InvalidRequest,
        `malformed call: ${issues.map((i) => `${i.path} ${i.message}`).join("; ")}`,
        {
          details: { issues },
        },
      );
}
