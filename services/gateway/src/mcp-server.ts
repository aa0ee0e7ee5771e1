import type {
  AuthInfo,
  CallToolRequest,
  CallToolResult,
  InputRequiredResult,
  JSONRPCRequest,
  Notification,
  RequestId,
  Result,
  ServerContext,
  Task,
} from "@modelcontextprotocol/server";
import { ProtocolError, ProtocolErrorCode, Server } from "@modelcontextprotocol/server";
import type { WaitingApproval } from "@toolmesh/call-store";
import type { ApprovalRequiredEvent, ProgressEvent, ToolMessage } from "@toolmesh/protocol";
import { ErrorCode, ToolmeshError } from "@toolmesh/protocol";
import { z } from "zod";
import type { Principal, ToolNames } from "./auth.js";
import type { InputRequired } from "./input-required.js";
import type { MeshCallHandle, MeshCallId } from "./mesh-view.js";
import type { MeshView } from "./mesh-view.js";
import {
  META_IDEMPOTENCY_KEY,
  META_TIMEOUT_MS,
  TASK_POLL_INTERVAL_MS,
  asError,
  requestKey,
} from "./mesh-view.js";
import { errorResult, toCallToolResult } from "./results.js";
import { shownMessage } from "./tool-names.js";

/** Reports one ended call (metrics). */
export type CallObserver = (
  tenant: string,
  tool: string,
  outcome: string,
  durationMs: number,
) => void;

/** The protocol era a server instance speaks: 2025-11-25 and older, or 2026-07-28. */
export type Era = "legacy" | "modern";

/** The name under which the Tasks extension is advertised in `server/discover`. */
export const TASKS_EXTENSION = "io.modelcontextprotocol/tasks";

/** What one request acts for. */
export interface RequestScope {
  principal: Principal;
  /** The agent the view is narrowed to, if any. */
  agent: string | undefined;
  /** The tool names the request is served: the mesh's, or their provider-safe forms. */
  names: ToolNames;
  /** The MCP session id the client sent (a namespace for request ids), if any. */
  mcpSession: string | undefined;
}

/** How long a task-augmented call may wait for the mesh to accept it, in ms. */
const ACCEPT_WAIT_MS = 10_000;

/**
 * What the server is handed with each request: its credential, its scope and, for a request the
 * legacy server serves under an id of its own, the client's request id.
 */
export function requestAuthInfo(scope: RequestScope, requestId?: RequestId): AuthInfo {
  return {
    token: "",
    clientId: scope.principal.credential,
    scopes: [],
    extra: { scope, ...(requestId === undefined ? {} : { requestId }) },
  };
}

/** The scope of a request, as the gateway handed it to the server. */
function scopeOf(ctx: ServerContext): RequestScope {
  const scope = ctx.http?.authInfo?.extra?.scope as RequestScope | undefined;
  if (scope === undefined)
    throw new ProtocolError(ProtocolErrorCode.InternalError, "a request without a scope");
  return scope;
}

/** The request id the client chose (cancellations name it). */
function clientRequestId(ctx: ServerContext): RequestId {
  return (ctx.http?.authInfo?.extra?.requestId as RequestId | undefined) ?? ctx.mcpReq.id;
}

const TaskIdParams = z.object({ taskId: z.string().min(1) }).loose();
const TaskUpdateParams = z
  .object({
    taskId: z.string().min(1),
    inputResponses: z.record(z.string(), z.unknown()).optional(),
    requestState: z.string().optional(),
  })
  .loose();
const CursorParams = z.object({ cursor: z.string().optional() }).loose().optional();

/**
 * The gateway's MCP server for one era. Nothing about a client is kept between requests, so any
 * replica answers any request: each request's scope comes with it, tools come from the mesh and
 * tasks from its call store, partitioned by tenant. The legacy server is one per process (fed by
 * an {@link ExchangeTransport}); a modern one is built per request by the SDK's handler.
 */
export function createMcpServer(
  mesh: MeshView,
  version: string,
  observe: CallObserver,
  era: Era,
  input: InputRequired,
): Server {
  const calls = new MeshCalls(mesh, observe, input);
  const server = new MeshServer(
    (request, ctx) => calls.startTask(request, ctx),
    { name: "toolmesh-gateway", version },
    {
      capabilities:
        era === "legacy"
          ? {
              tools: { listChanged: true },
              tasks: { list: {}, cancel: {}, requests: { tools: { call: {} } } },
            }
          : { tools: { listChanged: true }, extensions: { [TASKS_EXTENSION]: {} } },
    },
  );
  server.setRequestHandler("tools/list", async (request, ctx) => {
    const scope = scopeOf(ctx);
    try {
      return await mesh.listTools(scope.principal.tenant, {
        agent: scope.agent,
        names: scope.names,
        cursor: request.params?.cursor,
        identity: scope.principal.identity,
      });
    } catch (err) {
      throw asProtocolError(err);
    }
  });
  server.setRequestHandler("tools/call", (request, ctx) => calls.call(request, ctx));
  registerTaskHandlers(server, mesh, era, input);
  return server;
}

/**
 * The SDK's server, with task-augmented `tools/call` requests taken before the SDK validates
 * the result as a tool result: their answer is the task (`CreateTaskResult`), which the SDK's
 * 2026-07-28 codec does not know and whose `task` parameter it does not pass to handlers.
 */
class MeshServer extends Server {
  constructor(
    private readonly startTask: (request: CallToolRequest, ctx: ServerContext) => Promise<Result>,
    ...args: ConstructorParameters<typeof Server>
  ) {
    super(...args);
  }

  protected override _wrapHandler(
    method: string,
    handler: (request: JSONRPCRequest, ctx: ServerContext) => Promise<Result>,
  ): (request: JSONRPCRequest, ctx: ServerContext) => Promise<Result> {
    const wrapped = super._wrapHandler(method, handler);
    if (method !== "tools/call") return wrapped;
    return (request, ctx) =>
      isTaskAugmented(request)
        ? this.startTask(request as unknown as CallToolRequest, ctx)
        : wrapped(request, ctx);
  }
}

function isTaskAugmented(request: JSONRPCRequest): boolean {
  const task = (request.params as { task?: unknown } | undefined)?.task;
  return typeof task === "object" && task !== null;
}

/**
 * The task methods over the mesh's call store: a task is a mesh call, named by its call id and
 * visible only to its tenant (another tenant is answered as for a task that does not exist).
 * 2025-11-25 clients keep `tasks/list` and the blocking `tasks/result`; the 2026-07-28 extension
 * has neither, and adds `tasks/update`.
 */
function registerTaskHandlers(
  server: Server,
  mesh: MeshView,
  era: Era,
  input: InputRequired,
): void {
  const tasks = new MeshTasks(mesh, era, input);
  server.setRequestHandler("tasks/get", { params: TaskIdParams }, (params, ctx) =>
    tasks.get(ctx, params.taskId),
  );
  server.setRequestHandler("tasks/cancel", { params: TaskIdParams }, (params, ctx) =>
    tasks.cancel(ctx, params.taskId),
  );
  if (era === "modern") {
    server.setRequestHandler("tasks/update", { params: TaskUpdateParams }, (params, ctx) =>
      tasks.update(ctx, params),
    );
    return;
  }
  server.setRequestHandler("tasks/result", { params: TaskIdParams }, (params, ctx) =>
    tasks.result(ctx, params.taskId),
  );
  server.setRequestHandler("tasks/list", { params: CursorParams }, (params, ctx) =>
    tasks.list(ctx, params?.cursor),
  );
}

/** The task methods of {@link registerTaskHandlers}, one method each. */
class MeshTasks {
  constructor(
    private readonly mesh: MeshView,
    private readonly era: Era,
    private readonly input: InputRequired,
  ) {}

  /** `tasks/get`: the task; in the extension, with what it asks or, once ended, its result. */
  async get(ctx: ServerContext, taskId: string): Promise<Result> {
    const task = await this.#visible(ctx, taskId);
    if (this.era === "modern" && task.status === "input_required")
      return { ...task, ...(await taskInput(ctx, this.mesh, this.input, taskId)) };
    if (this.era === "legacy" || task.status === "working" || task.status === "input_required")
      return task;
    // The extension has no tasks/result: an ended task carries its tool result.
    const scope = scopeOf(ctx);
    const result = await this.mesh.taskResult(scope.principal.tenant, taskId, scope.names);
    return result === undefined ? task : { ...task, result };
  }

  /** `tasks/cancel`: cancels the task's call and answers with the task. */
  async cancel(ctx: ServerContext, taskId: string): Promise<Task> {
    await this.#visible(ctx, taskId);
    const { tenant } = scopeOf(ctx).principal;
    const state = await this.mesh.cancel(tenant, taskId);
    const task = await this.#visible(ctx, taskId);
    // The call ended by this request: cancelled, even before its record says so.
    return state === "cancelled" ? { ...task, status: "cancelled" as const } : task;
  }

  /** `tasks/update` (2026-07-28): gives a task in `input_required` the answers it asked for. */
  async update(ctx: ServerContext, params: z.infer<typeof TaskUpdateParams>): Promise<Task> {
    const task = await this.#visible(ctx, params.taskId);
    const state = params.requestState ?? ctx.mcpReq.requestState<string>();
    if (typeof state !== "string")
      throw new ProtocolError(
        ProtocolErrorCode.InvalidParams,
        `task ${params.taskId} is not waiting for input (status ${task.status})`,
      );
    try {
      const { tenant } = scopeOf(ctx).principal;
      const taken = await this.input.take(ctx, state, { callId: params.taskId });
      const responses = params.inputResponses ?? ctx.mcpReq.inputResponses ?? {};
      const resumption = await taken.source.answer(taken.call, responses);
      if (resumption.kind === "refused") throw resumption.error;
      // The task's call goes on under its id: joined by a resubmission, or resumed by the source.
      if (resumption.kind === "resubmit")
        this.mesh.submit(
          tenant,
          { id: params.taskId },
          { name: taken.call.tool, arguments: resumption.arguments },
        );
      return await this.#visible(ctx, params.taskId);
    } catch (err) {
      throw asProtocolError(err);
    }
  }

  /** `tasks/result` (2025-11-25): waits for the task to end and answers with its result. */
  async result(ctx: ServerContext, taskId: string): Promise<Result> {
    const scope = scopeOf(ctx);
    for (let delay = 50; ; delay = Math.min(delay * 2, TASK_POLL_INTERVAL_MS)) {
      const task = await this.#visible(ctx, taskId);
      if (task.status !== "working" && task.status !== "input_required") {
        const result = await this.mesh.taskResult(scope.principal.tenant, taskId, scope.names);
        if (result === undefined) throw taskNotFound(taskId);
        return result;
      }
      if (ctx.mcpReq.signal.aborted) throw taskNotFound(taskId);
      await new Promise((resolve) => setTimeout(resolve, delay));
    }
  }

  /** `tasks/list` (2025-11-25): a page of the tasks of the caller's principal. */
  async list(ctx: ServerContext, cursor: string | undefined): Promise<Result> {
    try {
      const { principal, names } = scopeOf(ctx);
      const { tenant, credential } = principal;
      const page = await this.mesh.listTasks(tenant, cursor, names);
      const tasks = page.tasks.filter((t) => this.mesh.boundTo(tenant, credential, t.taskId));
      return { ...page, tasks };
    } catch (err) {
      throw asProtocolError(err);
    }
  }

  /** The task, if the caller's principal may see it (another principal's is not found). */
  async #visible(ctx: ServerContext, taskId: string): Promise<Task> {
    const { principal, names } = scopeOf(ctx);
    const { tenant, credential } = principal;
    const task = this.mesh.boundTo(tenant, credential, taskId)
      ? await this.mesh.task(tenant, taskId, names)
      : undefined;
    if (task === undefined) throw taskNotFound(taskId);
    return task;
  }
}

/** The error of a task that does not exist, or that the caller may not see. */
function taskNotFound(id: string): ProtocolError {
  return new ProtocolError(ProtocolErrorCode.InvalidParams, `Task not found: ${id}`);
}

/**
 * What a task in `input_required` asks its client (`inputRequests` and the `requestState` its
 * `tasks/update` must carry), when the client takes forms; nothing otherwise.
 */
async function taskInput(
  ctx: ServerContext,
  mesh: MeshView,
  input: InputRequired,
  taskId: string,
): Promise<{ inputRequests?: unknown; requestState?: string }> {
  const tenant = scopeOf(ctx).principal.tenant;
  const waiting = await mesh.waiting(tenant, taskId);
  if (waiting === undefined) return {};
  const asked = await input.ask(ctx, {
    callId: taskId,
    tenant,
    tool: waiting.tool,
    arguments: waiting.arguments,
    waiting,
  });
  if (asked === undefined) return {};
  return {
    inputRequests: asked.inputRequests,
    ...(asked.requestState === undefined ? {} : { requestState: asked.requestState }),
  };
}

/** An approval event as the waiting state it announces. */
function waitingOf(event: ApprovalRequiredEvent): WaitingApproval {
  return {
    state: "waiting",
    kind: event.mode,
    approvalId: event.tool_call_id,
    tool: event.tool,
    arguments: {},
    requestedAt: event.requested_at,
    expiresAt: event.expires_at,
  };
}

/** A retried call whose answer was taken: its id, its arguments now, and whether it is in the mesh. */
interface Resumed {
  id: MeshCallId;
  arguments: Record<string, unknown>;
  /** True when the call was submitted before (the retry joins it); false: submit it now. */
  submitted: boolean;
}

/** What a `tools/call` starts from: its scope, its `_meta`, and the call a retry resumes. */
interface Begun {
  scope: RequestScope;
  meta: Record<string, unknown>;
  resumed: Resumed | undefined;
}

/** `tools/call` on the mesh: a synchronous call, or a task-augmented one answered with its task. */
class MeshCalls {
  constructor(
    private readonly mesh: MeshView,
    private readonly observe: CallObserver,
    private readonly input: InputRequired,
  ) {}

  /**
   * A task-augmented call: answered with its task once the mesh stored the call, or, before it
   * is submitted, with `input_required` when its caller must first authorize the tool (the
   * retry carrying the answer creates the task).
   */
  async startTask(request: CallToolRequest, ctx: ServerContext): Promise<Result> {
    const begun = await this.#begin(request, ctx);
    if ("refused" in begun) return begun.refused;
    const { scope, meta, resumed } = begun;
    let opened: InputRequiredResult | MeshCallHandle;
    try {
      opened = await this.#open(request, ctx, scope, meta, resumed, { sync: false });
    } catch (err) {
      throw asProtocolError(err);
    }
    if ("resultType" in opened) return opened;
    const { task } = await this.#created(scope, opened);
    // The 2026-07-28 extension marks the answer as a task; 2025-11-25 has `{ task }` alone.
    return ctx.mcpReq.envelope === undefined ? { task } : { resultType: "task", task };
  }

  /**
   * A synchronous call: answered with the call's result or, to a 2026-07-28 client that takes
   * forms, with `input_required` when the call lacks something its caller can give. The retry
   * carrying the answer submits the same call id again.
   */
  async call(
    request: CallToolRequest,
    ctx: ServerContext,
  ): Promise<CallToolResult | InputRequiredResult> {
    const begun = await this.#begin(request, ctx);
    if ("refused" in begun) return begun.refused;
    const { scope, meta, resumed } = begun;
    // A call that waits for its caller is asked of a client that can answer; others wait on.
    let onApproval: ((event: ApprovalRequiredEvent) => void) | undefined;
    const waits = new Promise<{ waiting: WaitingApproval }>((resolve) => {
      onApproval = (event) => {
        if (event.mode === "caller") resolve({ waiting: waitingOf(event) });
      };
    });
    let handle: MeshCallHandle;
    try {
      const opened = await this.#open(request, ctx, scope, meta, resumed, {
        sync: true,
        ...(onApproval === undefined ? {} : { onApproval }),
      });
      // Nothing submitted yet: the retry carrying the answer submits the call.
      if ("resultType" in opened) return opened;
      handle = opened;
    } catch (err) {
      return errorResult(asError(err).toWire());
    }

    const onAbort = (): void => {
      void handle.cancel().catch(() => undefined);
    };
    ctx.mcpReq.signal.addEventListener("abort", onAbort, { once: true });
    const { tenant } = scope.principal;
    const served =
      scope.mcpSession === undefined
        ? undefined
        : requestKey(tenant, scope.mcpSession, clientRequestId(ctx));
    if (served !== undefined) this.mesh.served.set(served, handle);
    try {
      const at = {
        callId: handle.callId,
        tenant,
        tool: request.params.name,
        arguments: resumed?.arguments ?? request.params.arguments ?? {},
      };
      const first = await Promise.race([
        handle.result.then((message): { message: ToolMessage } => ({ message })),
        waits,
      ]);
      if ("waiting" in first) {
        const asked = await this.input.ask(ctx, { ...at, waiting: first.waiting });
        if (asked !== undefined) {
          // The call waits in the mesh; the retry carrying the answer joins it.
          handle.release();
          return asked;
        }
      }
      const message = await handle.result;
      const asked = await this.input.ask(ctx, { ...at, message });
      return asked ?? toCallToolResult(message, scope.names);
    } finally {
      ctx.mcpReq.signal.removeEventListener("abort", onAbort);
      if (served !== undefined) this.mesh.served.delete(served);
    }
  }

  /**
   * Submits a new call, or the call a retry resumed: under the id it names or one made for it,
   * with its delegation obtained first unless it was submitted before. Answers `input_required`
   * instead when the caller must first authorize the tool (nothing is submitted then).
   */
  async #open(
    request: CallToolRequest,
    ctx: ServerContext,
    scope: RequestScope,
    meta: Record<string, unknown>,
    resumed: Resumed | undefined,
    options: { sync: boolean; onApproval?: (event: ApprovalRequiredEvent) => void },
  ): Promise<InputRequiredResult | MeshCallHandle> {
    const id = resumed?.id ?? this.#callIdOf(ctx, scope, meta, options.sync);
    const args = resumed?.arguments ?? request.params.arguments ?? {};
    if (resumed?.submitted !== true) {
      const asked = await this.#delegate(request, ctx, scope, id, args);
      if (asked !== undefined) return asked;
    }
    return this.#submit(request, ctx, scope, meta, id, { ...options, arguments: args });
  }

  /**
   * Obtains the call's delegation before it is submitted (ADR 0063). When its caller has not
   * authorized the tool's audience, answers `input_required` asking them to (URL mode), if the
   * client takes it; otherwise the call goes on and ends `credential_required` where it runs.
   */
  async #delegate(
    request: CallToolRequest,
    ctx: ServerContext,
    scope: RequestScope,
    id: MeshCallId,
    args: Record<string, unknown>,
  ): Promise<InputRequiredResult | undefined> {
    const name = this.mesh.meshName(request.params.name, scope.names);
    const consent = await this.mesh.delegate(id, name, scope.principal);
    if (consent === undefined) return undefined;
    return this.input.ask(ctx, {
      callId: id.id,
      tenant: scope.principal.tenant,
      tool: request.params.name,
      arguments: args,
      consent,
    });
  }

  /**
   * What every `tools/call` reads first: its scope, its checked `_meta` and, for a retry
   * carrying `requestState` (2026-07-28), the call it names and the arguments its answer gives
   * it. An invalid `_meta` or a refused state is the error to answer with.
   */
  async #begin(
    request: CallToolRequest,
    ctx: ServerContext,
  ): Promise<Begun | { refused: CallToolResult }> {
    const scope = scopeOf(ctx);
    const meta = (request.params._meta ?? {}) as Record<string, unknown>;
    const invalid = checkMeta(meta);
    if (invalid !== undefined) return { refused: errorResult(invalid.toWire()) };
    const state = ctx.mcpReq.envelope === undefined ? undefined : ctx.mcpReq.requestState<string>();
    if (typeof state !== "string") return { scope, meta, resumed: undefined };
    try {
      return { scope, meta, resumed: await this.#resume(request, ctx, state) };
    } catch (err) {
      return { refused: errorResult(asError(err).toWire()) };
    }
  }

  /** The call a retry's `requestState` names and the arguments its answer gives it. */
  async #resume(request: CallToolRequest, ctx: ServerContext, state: string): Promise<Resumed> {
    const taken = await this.input.take(ctx, state, {
      tool: request.params.name,
      arguments: request.params.arguments ?? {},
    });
    const resumption = await taken.source.answer(taken.call, ctx.mcpReq.inputResponses ?? {});
    if (resumption.kind === "refused") throw resumption.error;
    // A source that resumed the call itself: the same id joins it and answers with its result.
    if (resumption.kind === "resumed")
      return {
        id: { id: taken.call.callId },
        arguments: request.params.arguments ?? {},
        submitted: true,
      };
    return { id: { id: taken.call.callId }, arguments: resumption.arguments, submitted: false };
  }

  /** The mesh call id of a new call: named by its idempotency key, its request, or made. */
  #callIdOf(
    ctx: ServerContext,
    scope: RequestScope,
    meta: Record<string, unknown>,
    sync: boolean,
  ): MeshCallId {
    const key = meta[META_IDEMPOTENCY_KEY];
    return this.mesh.callId(scope.principal.tenant, {
      credential: scope.principal.credential,
      ...(typeof key === "string" ? { idempotencyKey: key } : {}),
      ...(sync && scope.mcpSession !== undefined
        ? { mcpSession: scope.mcpSession, requestId: clientRequestId(ctx) }
        : {}),
    });
  }

  #submit(
    request: CallToolRequest,
    ctx: ServerContext,
    scope: RequestScope,
    meta: Record<string, unknown>,
    id: MeshCallId,
    options: {
      sync: boolean;
      arguments?: Record<string, unknown>;
      onApproval?: (event: ApprovalRequiredEvent) => void;
    },
  ): MeshCallHandle {
    const { sync, onApproval } = options;
    const { tenant } = scope.principal;
    const name = this.mesh.meshName(request.params.name, scope.names);
    const timeoutMs = meta[META_TIMEOUT_MS] as number | undefined;
    const progressToken = sync
      ? (meta.progressToken ?? ctx.mcpReq._meta?.progressToken)
      : undefined;
    let progress = 0;
    const started = performance.now();
    const handle = this.mesh.submit(tenant, id, {
      name,
      arguments: options.arguments ?? request.params.arguments ?? {},
      ...(scope.agent === undefined ? {} : { agent: scope.agent }),
      ...(scope.principal.identity === undefined ? {} : { identity: scope.principal.identity }),
      ...(timeoutMs === undefined ? {} : { timeoutMs }),
      ...(onApproval === undefined ? {} : { onApproval }),
      ...(progressToken === undefined
        ? {}
        : {
            onProgress: (event: ProgressEvent) => {
              progress += 1;
              const token = progressToken as string | number;
              void ctx.mcpReq
                .notify(progressNotification(token, progress, event))
                .catch(() => undefined);
            },
          }),
    });
    let released = false;
    void handle.result.then((message) => {
      // A released call ends elsewhere: its outcome is observed where its answer is taken.
      if (!released)
        this.observe(tenant, name, message.error?.code ?? "ok", performance.now() - started);
    });
    return {
      ...handle,
      release: () => {
        released = true;
        handle.release();
      },
    };
  }

  /** The task of a call the mesh accepted (stored), or a task that has already failed. */
  async #created(
    scope: RequestScope,
    handle: ReturnType<MeshView["submit"]>,
  ): Promise<{ task: Task }> {
    const { tenant } = scope.principal;
    try {
      await this.mesh.awaitAccepted(tenant, handle, ACCEPT_WAIT_MS);
    } catch (err) {
      throw asProtocolError(err);
    }
    const created = await this.mesh.task(tenant, handle.callId, scope.names);
    if (created !== undefined) return { task: created };
    // Answered without a record (an invalid call): a task that has already failed.
    const message = shownMessage(await handle.result, scope.names);
    const now = new Date().toISOString();
    return {
      task: {
        taskId: handle.callId,
        status: "failed",
        ttl: null,
        createdAt: now,
        lastUpdatedAt: now,
        statusMessage: `${message.error?.code ?? "internal"}: ${message.error?.message ?? ""}`,
      },
    };
  }
}

/** What is wrong with the gateway's own `_meta` keys of a `tools/call`, if anything. */
function checkMeta(meta: Record<string, unknown>): ToolmeshError | undefined {
  const timeoutMs = meta[META_TIMEOUT_MS];
  const key = meta[META_IDEMPOTENCY_KEY];
  if (timeoutMs !== undefined && !(Number.isInteger(timeoutMs) && (timeoutMs as number) > 0)) {
    return new ToolmeshError(
      ErrorCode.InvalidRequest,
      `_meta["${META_TIMEOUT_MS}"] must be a positive integer (ms)`,
    );
  }
  if (key !== undefined && !(typeof key === "string" && key.length > 0 && key.length <= 256)) {
    return new ToolmeshError(
      ErrorCode.InvalidRequest,
      `_meta["${META_IDEMPOTENCY_KEY}"] must be a string of 1 to 256 characters`,
    );
  }
  return undefined;
}

/**
 * Cancels the call a client's `notifications/cancelled` names. The request may be served by
 * another replica: its mesh call is named by the MCP session and request id, so the cancellation
 * reaches it from here (a call with its own idempotency key is named by the key instead, and is
 * cancelled only where it is served).
 */
export async function cancelRequest(
  mesh: MeshView,
  scope: RequestScope,
  requestId: RequestId | undefined,
): Promise<void> {
  const { tenant } = scope.principal;
  if (scope.mcpSession === undefined || requestId === undefined) return;
  const served = mesh.served.get(requestKey(tenant, scope.mcpSession, requestId));
  if (served !== undefined) {
    await served.cancel().catch(() => undefined);
    return;
  }
  const id = mesh.callId(tenant, { mcpSession: scope.mcpSession, requestId });
  await mesh.cancel(tenant, id.id).catch(() => undefined);
}

function progressNotification(
  token: string | number,
  progress: number,
  event: ProgressEvent,
): Notification {
  const data = event.data as Record<string, unknown> | string | undefined;
  const total =
    typeof data === "object" && data !== null
      ? typeof data.total === "number"
        ? data.total
        : typeof data.of === "number"
          ? data.of
          : undefined
      : undefined;
  return {
    method: "notifications/progress",
    params: {
      progressToken: token,
      progress,
      ...(total === undefined ? {} : { total }),
      message: typeof data === "string" ? data : JSON.stringify(data ?? null),
    },
  };
}

function asProtocolError(err: unknown): ProtocolError {
  if (err instanceof ProtocolError) return err;
  if (err instanceof ToolmeshError) {
    const code =
      err.code === ErrorCode.InvalidRequest || err.code === ErrorCode.PermissionDenied
        ? ProtocolErrorCode.InvalidParams
        : ProtocolErrorCode.InternalError;
    return new ProtocolError(code, `${err.code}: ${err.message}`, err.toWire());
  }
  return new ProtocolError(
    ProtocolErrorCode.InternalError,
    err instanceof Error ? err.message : String(err),
  );
}
