import type { Msg, NatsConnection } from "@nats-io/nats-core";
import type { JetStreamClient, JsMsg } from "@nats-io/jetstream";
import { jetstream } from "@nats-io/jetstream";
import type {
  CallerIdentity,
  CatalogReply,
  DescribeReply,
  ExpandReply,
  GroupsReply,
  MissingArgumentsEvent,
  SchemaEvent,
  SchemaReason,
  SessionAddress,
  Subjects,
  ToolSchema,
} from "@toolmesh/protocol";
import {
  CatalogRequestSchema,
  Defaults,
  DescribeRequestSchema,
  ErrorCode,
  ExpandRequestSchema,
  GroupsRequestSchema,
  MissingArgumentsEventSchema,
  ToolmeshError,
  decodeJson,
  encodeJson,
  ensureError,
  parseRequest,
  payloadTooLarge,
  subjectToken,
  schemaMsgId,
} from "@toolmesh/protocol";
import type { RequestKind, RequestServer, StreamLimits, WorkLoop } from "@toolmesh/nats";
import {
  Semaphore,
  answerRequest,
  ensureConsumer,
  ensureStreams,
  meshPlan,
  publishDurable,
  rpcTenantScope,
  serveRequests,
  startWorkLoop,
  warnUnavailable,
  heartbeatMsFor,
} from "@toolmesh/nats";
import type { CompiledTool, ToolRegistry } from "@toolmesh/registry";
import type {
  CatalogConfig,
  SessionPolicy,
  SessionSchemasState,
  StateStore,
} from "@toolmesh/catalog";
import {
  buildCatalog,
  withProviderSafeNames,
  checkToolAccess,
  describeGroups,
  findAgent,
  modelSchema,
} from "@toolmesh/catalog";
import type { Logger, Tracer } from "@toolmesh/telemetry";
import type { PolicyDecider } from "@toolmesh/policy";
import {
  ATTR_TOOLMESH_CALL_ID,
  ATTR_TOOLMESH_SESSION_ID,
  ATTR_TOOLMESH_TOOL,
  processSpanOptions,
  toolmeshMetrics,
  withSpan,
} from "@toolmesh/telemetry";

/** Options of {@link startSchemaExpander}. Durations in ms. */
export interface SchemaExpanderOptions {
  nc: NatsConnection;
  subjects: Subjects;
  registry: ToolRegistry;
  /** Per-session and per-tenant state (`StateStore.open`). */
  store: StateStore;
  /** Tool sets and agents (`loadCatalogConfig`). */
  catalog: CatalogConfig;
  log: Logger;
  tracer: Tracer;
  streamLimits?: StreamLimits;
  /** The Cedar policy sets in force (docs/policy.md): catalogs show only what they permit. */
  policies?: PolicyDecider | undefined;
  /** Events handled at once by this process. Default 16. */
  concurrency?: number;
  /** How long a delivered event stays owned without a heartbeat, in ms. Default 10 000. */
  ackWaitMs?: number;
}

/** A running schema expander. */
export interface SchemaExpander {
  /** Stops taking events and requests; waits for those in hand (at most `graceMs`, default 10 s). */
  stop(graceMs?: number): Promise<void>;
}

/** What the expander's handlers work with: one process's connection, registry and state. */
export interface ExpanderDeps {
  js: JetStreamClient;
  subjects: Subjects;
  registry: ToolRegistry;
  store: StateStore;
  catalog: CatalogConfig;
  log: Logger;
  tracer: Tracer;
  /**
   * Most bytes of catalog entries one catalog reply carries (ADR 0049); more tools follow on
   * pages. Default 3/4 of the server's `max_payload`.
   */
  pageBytes?: number;
  /** The Cedar policy sets in force; every tool is listed when undefined. */
  policies?: PolicyDecider | undefined;
}

/** Queue group of the schema expanders' request-reply subscriptions. */
export const SCHEMA_EXPANDER_QUEUE = "toolmesh-schema-expander";

// Deliveries of an event naming a tool (or revision) this process's registry has not seen yet:
// the registry watcher may lag the resolver's by a moment.
const REGISTRY_LAG_RETRIES = 3;
const REGISTRY_LAG_DELAY_MS = 500;

/**
 * Schema expansion ([protocol](../../../docs/protocol.md#schema-expansion-catalog-and-tool-groups)) as a service. Consumes missing-arguments events from the events
 * stream through one durable consumer shared by every replica; the first time a session calls a
 * tool with required arguments missing it publishes the tool's full schema to that session and
 * records it in the session's `expanded_tools`. It sends it again only when the frontend asks
 * (`expand`) or the tool's registry revision changed. Serves `catalog`, `describe`, `expand` and
 * `groups` requests.
 *
 * Two replicas never publish the same schema twice: a replica first claims the
 * `{tool → revision}` entry by compare-and-set on the session's state and publishes only if its
 * claim won. The schema's `Nats-Msg-Id` (`schema:{tenant}:{session}:{tool}:{revision}`) only
 * keeps the stored copy single if a publish is retried; live subscribers would still get a
 * duplicate, so it is not what prevents them.
 */
export async function startSchemaExpander(options: SchemaExpanderOptions): Promise<SchemaExpander> {
  const { nc, subjects, registry, store, catalog, log, tracer } = options;
  const jsm = await ensureStreams(nc, subjects, options.streamLimits);
  const js = jetstream(nc);
  const ackWaitMs = options.ackWaitMs ?? Defaults.ackWaitMs;
  await ensureConsumer(jsm, meshPlan(subjects, { ackWaitMs }).consumers.schemaExpander);
  const pageBytes = Math.floor(
    (nc.info?.max_payload ?? Defaults.maxMessageBytes) * Defaults.catalogPageShare,
  );
  const deps: ExpanderDeps = {
    js,
    subjects,
    registry,
    store,
    catalog,
    log,
    tracer,
    pageBytes,
    policies: options.policies,
  };

  const loop: WorkLoop = await startWorkLoop({
    js,
    stream: subjects.streams.events,
    consumer: subjects.schemaExpanderConsumer,
    slots: new Semaphore(options.concurrency ?? Defaults.concurrency),
    maxMessages: 16,
    heartbeatMs: heartbeatMsFor(ackWaitMs),
    handle: (msg) => handleEvent(deps, msg),
    onConsumerUnavailable: warnUnavailable(log, subjects.schemaExpanderConsumer),
    onError: (err) => log.error({ err }, "schema expander loop error"),
  });

  const serve = (subject: string, handler: RequestHandler): RequestServer =>
    serveRequests({
      nc,
      subject,
      queue: SCHEMA_EXPANDER_QUEUE,
      ...expanderRequests(deps, handler),
    });
  const servers = [
    serve(subjects.allCatalogRpc, answerCatalog),
    serve(subjects.allDescribeRpc, answerDescribe),
    serve(subjects.allExpandRpc, answerExpand),
    serve(subjects.allGroupsRpc, answerGroups),
  ];

  const stopWatching = registry.logChanges(log);
  log.info(
    {
      prefix: subjects.prefix,
      tools: [...registry.names()],
      agents: [...catalog.agents.keys()],
      toolSets: [...catalog.toolSets.keys()],
      sessionTtlMs: store.sessionTtlMs,
    },
    "schema-expander started",
  );

  return {
    async stop(graceMs: number = Defaults.shutdownGraceMs) {
      stopWatching();
      await Promise.all([...servers.map((server) => server.stop(graceMs)), loop.stop(graceMs)]);
    },
  };
}

/** Handles one missing-arguments event: sends the tool's schema to the session once. */
export async function handleEvent(deps: ExpanderDeps, msg: JsMsg): Promise<void> {
  const { log, tracer } = deps;
  let event: MissingArgumentsEvent;
  try {
    event = MissingArgumentsEventSchema.parse(decodeJson(msg.data));
  } catch (err) {
    log.warn({ err, subject: msg.subject, seq: msg.seq }, "dropping an event that is not valid");
    msg.term();
    return;
  }
  await withSpan(
    tracer,
    "expand schema",
    processSpanOptions(msg, {
      [ATTR_TOOLMESH_SESSION_ID]: event.address.session,
      [ATTR_TOOLMESH_CALL_ID]: event.tool_call_id,
      [ATTR_TOOLMESH_TOOL]: event.tool,
    }),
    async () => {
      const eventLog = log.child({
        sessionId: event.session_id,
        tool: event.tool,
        callId: event.tool_call_id,
      });
      try {
        await expandOnce(deps, event, msg, eventLog);
      } catch (err) {
        eventLog.error({ err: ensureError(err) }, "cannot expand the schema; it will be retried");
        msg.nak(1_000);
      }
    },
  );
}

/** Claims the schema for the session by compare-and-set and publishes it if the claim won. */
export async function expandOnce(
  deps: ExpanderDeps,
  event: MissingArgumentsEvent,
  msg: JsMsg,
  eventLog: Logger,
): Promise<void> {
  const { registry, store } = deps;
  const tool = registry.get(event.tool);
  if (tool === undefined || tool.revision < event.tool_revision) {
    if (msg.info.deliveryCount <= REGISTRY_LAG_RETRIES) {
      msg.nak(REGISTRY_LAG_DELAY_MS);
      return;
    }
    if (tool === undefined) {
      eventLog.info("the tool is no longer registered; no schema sent");
      msg.ack();
      return;
    }
  }
  const { address } = event;
  const revision = tool.revision;
  let claimed = false;
  let firstForSession = false;
  await store.updateSchemas(address, event.session_id, (current) => {
    claimed = false;
    firstForSession = current.expanded_tools.size === 0;
    const requested = withRequested(current, [event.tool]);
    if (current.expanded_tools.get(event.tool) === revision) {
      return requested === current ? undefined : requested;
    }
    claimed = true;
    return withExpanded(requested, [[event.tool, revision]]);
  });
  if (!claimed) {
    eventLog.debug({ revision }, "schema already sent to the session");
    msg.ack();
    return;
  }
  try {
    await publishSchema(deps, address, event.session_id, modelSchema(tool), {
      reason: "missing_arguments",
      missing: event.missing_required,
      toolCallId: event.tool_call_id,
      msgId: schemaMsgId(address, subjectToken(event.tool), revision),
    });
  } catch (err) {
    // Give the claim back, so the redelivery (or another replica) sends it.
    await store
      .updateSchemas(address, event.session_id, (current) => {
        if (current.expanded_tools.get(event.tool) !== revision) return undefined;
        const expanded = new Map(current.expanded_tools);
        expanded.delete(event.tool);
        return { ...current, expanded_tools: expanded };
      })
      .catch((undo: unknown) => eventLog.warn({ err: undo }, "cannot release the claim"));
    throw err;
  }
  toolmeshMetrics().schemaExpanded(event.tool, firstForSession);
  eventLog.info({ revision, missing: event.missing_required }, "schema sent to the session");
  msg.ack();
}

async function publishSchema(
  deps: Pick<ExpanderDeps, "js" | "subjects">,
  address: SessionAddress,
  sessionId: string,
  schema: ToolSchema,
  extra: { reason: SchemaReason; missing: string[]; toolCallId?: string; msgId?: string },
): Promise<void> {
  const event: SchemaEvent = {
    ...schema,
    session_id: sessionId,
    reason: extra.reason,
    missing: extra.missing,
    at: Date.now(),
  };
  if (extra.toolCallId !== undefined) event.tool_call_id = extra.toolCallId;
  await publishDurable(
    deps.js,
    deps.subjects.schema(address, schema.tool),
    event,
    extra.msgId === undefined ? {} : { msgId: extra.msgId },
  );
}

/** Answers one request of a tenant (the token of the subject) with the request's body. */
export type RequestHandler = (
  deps: ExpanderDeps,
  tenant: string,
  body: unknown,
) => Promise<unknown>;

/** How a request kind is served: `handler`'s reply, or `{ ok: false, error }`. */
export function expanderRequests(deps: ExpanderDeps, handler: RequestHandler): RequestKind<string> {
  return {
    log: deps.log,
    scope: rpcTenantScope(deps.subjects),
    maxRequestBytes: Defaults.maxSmallRequestBytes,
    handle: (body, _msg, tenant) => handler(deps, tenant, body),
  };
}

/** Answers one request with `handler`'s reply, or with the error it threw, typed. */
export function answer(deps: ExpanderDeps, msg: Msg, handler: RequestHandler): Promise<void> {
  return answerRequest(msg, expanderRequests(deps, handler));
}

/** The session's policy and its tenant's group switches, read from KV (fresh). */
async function accessState(
  deps: Pick<ExpanderDeps, "store">,
  tenant: string,
  at: SessionAddress | undefined,
): Promise<{
  tenantGroups: ReadonlyMap<string, boolean> | undefined;
  session: SessionPolicy | undefined;
}> {
  const [tenantState, policy] = await Promise.all([
    deps.store.getTenantGroups(tenant),
    at === undefined ? undefined : deps.store.getPolicy(at),
  ]);
  return { tenantGroups: tenantState?.groups, session: policy?.value };
}

/** The tools a session (or a tenant) may call, as a model sees them. */
export async function answerCatalog(
  deps: ExpanderDeps,
  tenant: string,
  body: unknown,
): Promise<CatalogReply> {
  const { registry, store, catalog } = deps;
  const request = parseRequest(CatalogRequestSchema, body);
  const subject = subjectOf(request.identity, tenant);
  const at =
    request.session_id === undefined
      ? undefined
      : { tenant, session: subjectToken(request.session_id) };
  if (request.bind_agent && (at === undefined || request.agent === undefined)) {
    throw new ToolmeshError(ErrorCode.InvalidRequest, "bind_agent needs session_id and agent");
  }
  const state = await accessState(deps, tenant, at);
  if (request.bind_agent && at !== undefined && request.agent !== undefined) {
    state.session = await bindAgent(deps, at, request.session_id ?? "", request.agent);
  }
  const expanded =
    at === undefined ? undefined : (await store.getSchemas(at))?.value.expanded_tools;
  const built = buildCatalog({
    tools: listable(
      deps,
      registry.tools(),
      { tenant, agent: state.session?.agent ?? request.agent, subject },
      at,
    ),
    tenantGroups: state.tenantGroups,
    session: state.session,
    agent: request.agent,
    agents: catalog.agents,
    expanded: expanded === undefined ? undefined : new Set(expanded.keys()),
  });
  const reply: CatalogReply = {
    ok: true,
    tools: [],
    ...(built.agent === undefined ? {} : { agent: built.agent }),
    ...(built.outputStrategy === undefined ? {} : { output_strategy: built.outputStrategy }),
    unavailable: built.unavailable,
  };
  const tools =
    request.names === "provider_safe" ? withProviderSafeNames(built.tools) : built.tools;
  return catalogPage(reply, tools, Number(request.cursor ?? 0), deps.pageBytes);
}

/**
 * One page of a catalog: the entries from `start` on while they fit in `pageBytes` with the
 * rest of the reply (at least one), and `next_cursor` when more follow.
 */
export function catalogPage(
  reply: CatalogPage,
  entries: CatalogPage["tools"],
  start: number,
  pageBytes = Number.POSITIVE_INFINITY,
): CatalogReply {
  let room = pageBytes - encodeJson(reply).length - NEXT_CURSOR_BYTES;
  let end = start;
  for (; end < entries.length; end++) {
    const bytes = encodeJson(entries[end]).length + 1;
    if (bytes > room && end > start) break;
    room -= bytes;
  }
  return {
    ...reply,
    tools: entries.slice(start, end),
    ...(end < entries.length ? { next_cursor: String(end) } : {}),
  };
}

type CatalogPage = Extract<CatalogReply, { ok: true }>;

/** Room for `"next_cursor":"123456789",` in a page. */
const NEXT_CURSOR_BYTES = 32;

async function bindAgent(
  deps: Pick<ExpanderDeps, "store" | "catalog" | "log">,
  at: SessionAddress,
  sessionId: string,
  agent: string,
): Promise<SessionPolicy> {
  const { store, catalog, log } = deps;
  if (catalog.agents.size === 0) {
    throw new ToolmeshError(
      ErrorCode.InvalidRequest,
      `cannot bind the session to agent "${agent}": no agents are configured`,
      { details: { agent } },
    );
  }
  findAgent(agent, catalog.agents);
  const outcome = await store.updatePolicy(at, sessionId, (current) => {
    if (current.agent === agent) return undefined;
    if (current.agent !== undefined) {
      throw new ToolmeshError(
        ErrorCode.PermissionDenied,
        `the session is bound to agent "${current.agent}"; it cannot be bound to "${agent}"`,
        { details: { agent, bound_agent: current.agent, reason: "other_agent" } },
      );
    }
    return { ...current, agent };
  });
  if (outcome.changed) log.info({ sessionId, agent }, "session bound to agent");
  return outcome.value;
}

/** The full schemas of the named tools, recorded as expanded for the session. */
export async function answerDescribe(
  deps: ExpanderDeps,
  tenant: string,
  body: unknown,
): Promise<DescribeReply> {
  const request = parseRequest(DescribeRequestSchema, body);
  const subject = subjectOf(request.identity, tenant);
  const at = { tenant, session: subjectToken(request.session_id) };
  const state = await accessState(deps, tenant, at);
  const schemas: ToolSchema[] = [];
  const errors: Extract<DescribeReply, { ok: true }>["errors"] = [];
  // The schemas that fit in one answer (at least one); the rest are refused, to ask for again.
  let room = deps.pageBytes ?? Number.POSITIVE_INFINITY;
  for (const name of new Set(request.tools)) {
    try {
      const schema = modelSchema(callableTool(deps, name, state, request.agent, at, subject));
      const bytes = encodeJson(schema).length;
      if (bytes > room && schemas.length > 0) throw describeTooLarge(name, bytes, room);
      room -= bytes;
      schemas.push(schema);
    } catch (err) {
      // Unknown, disabled or not allowed: that tool's refusal. Anything else fails the request.
      if (!(err instanceof ToolmeshError)) throw err;
      errors.push({ tool: name, error: err.toWire() });
    }
  }
  if (schemas.length > 0) await recordSent(deps, at, request.session_id, schemas);
  return { ok: true, schemas, errors };
}

/** The refusal of a tool whose schema no longer fits in a describe answer. */
function describeTooLarge(tool: string, bytes: number, room: number): ToolmeshError {
  return payloadTooLarge(
    `the schema of "${tool}" (${bytes} bytes) does not fit in this answer with the others (${Math.max(room, 0)} bytes left): describe it in a request of its own`,
    { field: "reply", bytes, limit: Math.max(room, 0), tool },
  );
}

/** Records schemas given to a session on request: requested, and expanded at their revision. */
async function recordSent(
  deps: ExpanderDeps,
  at: SessionAddress,
  sessionId: string,
  schemas: ToolSchema[],
): Promise<void> {
  await deps.store.updateSchemas(at, sessionId, (current) =>
    withExpanded(
      withRequested(
        current,
        schemas.map((s) => s.tool),
      ),
      schemas.map((s) => [s.tool, s.revision]),
    ),
  );
}

/** Sends a tool's schema to the session again, on the frontend's request. */
export async function answerExpand(
  deps: ExpanderDeps,
  tenant: string,
  body: unknown,
): Promise<ExpandReply> {
  const request = parseRequest(ExpandRequestSchema, body);
  const at = { tenant, session: subjectToken(request.session_id) };
  const state = await accessState(deps, tenant, at);
  const schema = modelSchema(callableTool(deps, request.tool, state, request.agent, at));
  // Forced: no message id, so a second `expand` is sent too.
  await publishSchema(deps, at, request.session_id, schema, { reason: "expand", missing: [] });
  await recordSent(deps, at, request.session_id, [schema]);
  deps.log.info(
    { sessionId: request.session_id, tool: schema.tool },
    "schema sent again on request",
  );
  return { ok: true, schema };
}

/** Switches tool groups on or off for a tenant or one session. */
export async function answerGroups(
  deps: ExpanderDeps,
  tenant: string,
  body: unknown,
): Promise<GroupsReply> {
  const { registry, store, log } = deps;
  const request = parseRequest(GroupsRequestSchema, body);
  const enable = new Set(request.enable);
  const disable = new Set(request.disable);
  const reset = new Set(request.reset);
  const both = [...enable].filter((g) => disable.has(g) || reset.has(g));
  const twice = [...disable].filter((g) => reset.has(g));
  if (both.length > 0 || twice.length > 0) {
    throw new ToolmeshError(
      ErrorCode.InvalidRequest,
      `a group may be named once per request: ${[...both, ...twice].join(", ")}`,
      { details: { groups: [...both, ...twice] } },
    );
  }
  const change = (current: ReadonlyMap<string, boolean>): Map<string, boolean> | undefined => {
    const next = new Map(current);
    for (const g of enable) next.set(g, true);
    for (const g of disable) next.set(g, false);
    for (const g of reset) next.delete(g);
    const same =
      next.size === current.size && [...next].every(([g, active]) => current.get(g) === active);
    return same ? undefined : next;
  };
  const changes = { enable: [...enable], disable: [...disable], reset: [...reset] };
  const defs = [...registry.tools()].map((t) => t.definition);
  if (request.session_id === undefined) {
    const outcome = await store.updateTenantGroups(tenant, (current) => {
      const groups = change(current.groups);
      return groups === undefined ? undefined : { ...current, groups };
    });
    if (outcome.changed) log.info({ tenant, ...changes }, "tenant tool groups switched");
    return {
      ok: true,
      scope: "tenant",
      groups: describeGroups(defs, outcome.value.groups, undefined),
    };
  }
  const at = { tenant, session: subjectToken(request.session_id) };
  const [tenantGroups, outcome] = await Promise.all([
    store.getTenantGroups(tenant),
    store.updatePolicy(at, request.session_id, (current) => {
      const groups = change(current.groups);
      return groups === undefined ? undefined : { ...current, groups };
    }),
  ]);
  if (outcome.changed) {
    log.info({ sessionId: request.session_id, ...changes }, "session tool groups switched");
  }
  return {
    ok: true,
    scope: "session",
    groups: describeGroups(defs, tenantGroups?.groups, outcome.value),
  };
}

/**
 * The subject policies see as `context.subject` for a catalog or describe request: its
 * identity's, which must be of the requester's tenant (as for a call).
 */
function subjectOf(identity: CallerIdentity | undefined, tenant: string): string | undefined {
  if (identity === undefined) return undefined;
  if (subjectToken(identity.tenant) !== tenant)
    throw new ToolmeshError(
      ErrorCode.PermissionDenied,
      "identity.tenant is not the requester's tenant: a catalog may be asked only for its own tenant's users",
      { details: { identity_tenant: identity.tenant } },
    );
  return identity.subject;
}

/**
 * The tools the policies in force let the tenant (as `agent`, for `subject`, in session `at`)
 * see.
 */
function* listable(
  deps: Pick<ExpanderDeps, "policies">,
  tools: Iterable<CompiledTool>,
  who: { tenant: string; agent: string | undefined; subject: string | undefined },
  at: SessionAddress | undefined,
): Iterable<CompiledTool> {
  const { policies } = deps;
  for (const tool of tools)
    if (
      policies === undefined ||
      policies.mayList({ ...who, tool: tool.definition, session: at?.session })
    )
      yield tool;
}

/** The tool, if this session (as `agent`) may call it; else the error a call would get. */
function callableTool(
  deps: Pick<ExpanderDeps, "registry" | "catalog" | "policies">,
  name: string,
  state: {
    tenantGroups: ReadonlyMap<string, boolean> | undefined;
    session: SessionPolicy | undefined;
  },
  agent: string | undefined,
  at: SessionAddress,
  subject?: string,
): CompiledTool {
  const tool = deps.registry.get(name);
  if (tool === undefined) {
    throw new ToolmeshError(ErrorCode.UnknownTool, `unknown tool "${name}"`, {
      details: { tool: name, close_matches: [] },
    });
  }
  const denied = checkToolAccess(tool.definition, {
    ...state,
    agent,
    agents: deps.catalog.agents,
  });
  if (denied !== undefined) throw denied;
  const hidden = deps.policies?.listRefusal({
    tenant: at.tenant,
    tool: tool.definition,
    agent: state.session?.agent ?? agent,
    subject,
    session: at.session,
  });
  if (hidden !== undefined) throw hidden;
  return tool;
}

/** `current` with `tools` added to `requested_tools` (the same object when nothing is new). */
function withRequested(
  current: SessionSchemasState,
  tools: readonly string[],
): SessionSchemasState {
  const fresh = tools.filter((t) => !current.requested_tools.includes(t));
  if (fresh.length === 0) return current;
  return { ...current, requested_tools: [...current.requested_tools, ...new Set(fresh)] };
}

/** `current` with each tool's expanded revision set. */
function withExpanded(
  current: SessionSchemasState,
  entries: readonly (readonly [string, number])[],
): SessionSchemasState {
  const expanded = new Map(current.expanded_tools);
  for (const [tool, revision] of entries) expanded.set(tool, revision);
  return { ...current, expanded_tools: expanded };
}
