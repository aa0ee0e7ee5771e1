import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import type { TaskStore } from "@modelcontextprotocol/sdk/experimental/tasks/interfaces.js";
import type { AuthInfo } from "@modelcontextprotocol/sdk/server/auth/types.js";
import type { RequestId, Result, ServerNotification } from "@modelcontextprotocol/sdk/types.js";
import {
  CallToolRequestSchema,
  ListToolsRequestSchema,
  McpError,
  ErrorCode as McpErrorCode,
} from "@modelcontextprotocol/sdk/types.js";
import type { ProgressEvent } from "@toolmesh/protocol";
import { ErrorCode, ToolmeshError } from "@toolmesh/protocol";
import type { Principal } from "./auth.js";
import type { MeshView } from "./mesh-view.js";
import {
  META_IDEMPOTENCY_KEY,
  META_TIMEOUT_MS,
  TASK_POLL_INTERVAL_MS,
  requestKey,
} from "./mesh-view.js";
import { errorResult, toCallToolResult } from "./results.js";

/** Reports one ended call (metrics). */
export type CallObserver = (
  tenant: string,
  tool: string,
  outcome: string,
  durationMs: number,
) => void;

/** What one request acts for. */
export interface RequestScope {
  principal: Principal;
  /** The agent the view is narrowed to, if any. */
  agent: string | undefined;
  /** The MCP session id the client sent (a namespace for request ids), if any. */
  mcpSession: string | undefined;
}

/** What a request's handler learns of it: its scope and the client's own request id. */
export interface RequestContext {
  scope: RequestScope;
  requestId: RequestId;
}

/** How long a task-augmented call may wait for the mesh to accept it, in ms. */
const ACCEPT_WAIT_MS = 10_000;

/** The scope of a request, as the gateway handed it to the server. */
function contextOf(extra: { authInfo?: AuthInfo | undefined }): RequestContext {
  const context = extra.authInfo?.extra?.context as RequestContext | undefined;
  if (context === undefined)
    throw new McpError(McpErrorCode.InternalError, "a request without a scope");
  return context;
}

/** What the server is handed with each request: its credential and its context. */
export function requestAuthInfo(context: RequestContext): AuthInfo {
  return {
    token: "",
    clientId: context.scope.principal.credential,
    scopes: [],
    extra: { context },
  };
}

/**
 * The gateway's MCP server: one per process, serving every request of every client through an
 * {@link ExchangeTransport} (nothing about a client is kept between requests, so any replica
 * answers any request). Each request's scope comes with it; tools come from the mesh, tasks from
 * its call store, partitioned by tenant.
 */
export function createMcpServer(mesh: MeshView, version: string, observe: CallObserver): Server {
  const server = new Server(
    { name: "toolmesh-gateway", version },
    {
      capabilities: {
        tools: { listChanged: true },
        tasks: { list: {}, cancel: {}, requests: { tools: { call: {} } } },
      },
      taskStore: meshTaskStore(mesh),
      defaultTaskPollInterval: TASK_POLL_INTERVAL_MS,
    },
  );

  server.setRequestHandler(ListToolsRequestSchema, async (request, extra) => {
    const { scope } = contextOf(extra);
    try {
      return await mesh.listTools(scope.principal.tenant, scope.agent, request.params?.cursor);
    } catch (err) {
      throw asMcpError(err);
    }
  });

  server.setRequestHandler(CallToolRequestSchema, async (request, extra) => {
    const { scope, requestId } = contextOf(extra);
    const { tenant } = scope.principal;
    const { name } = request.params;
    const args = request.params.arguments ?? {};
    const meta = request.params._meta ?? {};
    const started = performance.now();
    const timeoutMs = meta[META_TIMEOUT_MS];
    const key = meta[META_IDEMPOTENCY_KEY];
    if (timeoutMs !== undefined && !(Number.isInteger(timeoutMs) && (timeoutMs as number) > 0)) {
      return errorResult(
        new ToolmeshError(
          ErrorCode.InvalidRequest,
          `_meta["${META_TIMEOUT_MS}"] must be a positive integer (ms)`,
        ).toWire(),
      );
    }
    if (key !== undefined && !(typeof key === "string" && key.length > 0 && key.length <= 256)) {
      return errorResult(
        new ToolmeshError(
          ErrorCode.InvalidRequest,
          `_meta["${META_IDEMPOTENCY_KEY}"] must be a string of 1 to 256 characters`,
        ).toWire(),
      );
    }
    const task = request.params.task;
    const id = mesh.callId(tenant, {
      ...(typeof key === "string" ? { idempotencyKey: key } : {}),
      ...(task === undefined && scope.mcpSession !== undefined
        ? { mcpSession: scope.mcpSession, requestId }
        : {}),
    });
    const progressToken = meta.progressToken;
    let progress = 0;
    const handle = mesh.submit(tenant, id, {
      name,
      arguments: args,
      ...(scope.agent === undefined ? {} : { agent: scope.agent }),
      ...(timeoutMs === undefined ? {} : { timeoutMs: timeoutMs as number }),
      ...(progressToken === undefined || task !== undefined
        ? {}
        : {
            onProgress: (event: ProgressEvent) => {
              progress += 1;
              void extra
                .sendNotification(progressNotification(progressToken, progress, event))
                .catch(() => undefined);
            },
          }),
    });
    void handle.result.then((message) =>
      observe(tenant, name, message.error?.code ?? "ok", performance.now() - started),
    );

    if (task !== undefined) {
      try {
        await mesh.awaitAccepted(tenant, handle, ACCEPT_WAIT_MS);
      } catch (err) {
        throw asMcpError(err);
      }
      const created = await mesh.task(tenant, id.id);
      if (created !== undefined) return { task: created };
      // Answered without a record (an invalid call): a task that has already failed.
      const message = await handle.result;
      const now = new Date().toISOString();
      return {
        task: {
          taskId: id.id,
          status: "failed",
          ttl: null,
          createdAt: now,
          lastUpdatedAt: now,
          statusMessage: `${message.error?.code ?? "internal"}: ${message.error?.message ?? ""}`,
        },
      };
    }

    const onAbort = (): void => {
      void handle.cancel().catch(() => undefined);
    };
    extra.signal.addEventListener("abort", onAbort, { once: true });
    const served =
      scope.mcpSession === undefined ? undefined : requestKey(tenant, scope.mcpSession, requestId);
    if (served !== undefined) mesh.served.set(served, handle);
    try {
      return toCallToolResult(await handle.result);
    } finally {
      extra.signal.removeEventListener("abort", onAbort);
      if (served !== undefined) mesh.served.delete(served);
    }
  });

  return server;
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
): ServerNotification {
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

/**
 * The SDK's task store, answered from the mesh's call store. The SDK passes each request's
 * `sessionId`, which the {@link ExchangeTransport} makes the request's tenant.
 */
function meshTaskStore(mesh: MeshView): TaskStore {
  const notFound = (id: string): McpError =>
    new McpError(McpErrorCode.InvalidParams, `Task not found: ${id}`);
  const tenantOf = (sessionId: string | undefined): string => {
    if (sessionId === undefined)
      throw new McpError(McpErrorCode.InternalError, "a task request without a tenant");
    return sessionId;
  };
  return {
    createTask() {
      // Tasks are created by tools/call itself: the task id names the mesh call.
      return Promise.reject(
        new McpError(McpErrorCode.InternalError, "tasks start with tools/call"),
      );
    },
    async getTask(taskId, sessionId) {
      return (await mesh.task(tenantOf(sessionId), taskId)) ?? null;
    },
    storeTaskResult() {
      return Promise.reject(new McpError(McpErrorCode.InternalError, "the mesh stores results"));
    },
    async getTaskResult(taskId, sessionId): Promise<Result> {
      const result = await mesh.taskResult(tenantOf(sessionId), taskId);
      if (result === undefined) throw notFound(taskId);
      return result;
    },
    async updateTaskStatus(taskId, status, _message, sessionId) {
      if (status !== "cancelled")
        throw new McpError(McpErrorCode.InvalidParams, `a task can only be cancelled`);
      const state = await mesh.cancel(tenantOf(sessionId), taskId);
      if (state === "unknown") throw notFound(taskId);
    },
    async listTasks(cursor, sessionId) {
      try {
        return await mesh.listTasks(tenantOf(sessionId), cursor);
      } catch (err) {
        throw asMcpError(err);
      }
    },
  };
}

function asMcpError(err: unknown): McpError {
  if (err instanceof McpError) return err;
  if (err instanceof ToolmeshError) {
    const code =
      err.code === ErrorCode.InvalidRequest || err.code === ErrorCode.PermissionDenied
        ? McpErrorCode.InvalidParams
        : McpErrorCode.InternalError;
    return new McpError(code, `${err.code}: ${err.message}`, err.toWire());
  }
  return new McpError(McpErrorCode.InternalError, err instanceof Error ? err.message : String(err));
}
