import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import type { TaskStore } from "@modelcontextprotocol/sdk/experimental/tasks/interfaces.js";
import type { Result, ServerNotification } from "@modelcontextprotocol/sdk/types.js";
import {
  CallToolRequestSchema,
  CancelledNotificationSchema,
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

/** What one request's MCP server acts for. */
export interface RequestScope {
  principal: Principal;
  /** The agent the view is narrowed to, if any. */
  agent: string | undefined;
  /** The MCP session id the client sent (a namespace for request ids), if any. */
  mcpSession: string | undefined;
}

/** How long a task-augmented call may wait for the mesh to accept it, in ms. */
const ACCEPT_WAIT_MS = 10_000;

/**
 * An MCP server for one HTTP request (the transport is stateless: every request gets a fresh
 * one, so any replica answers any request). Tools come from the mesh; tasks from its call store.
 */
export function createMcpServer(
  mesh: MeshView,
  scope: RequestScope,
  version: string,
  observe: CallObserver,
): Server {
  const { tenant } = scope.principal;
  const server = new Server(
    { name: "toolmesh-gateway", version },
    {
      capabilities: {
        tools: { listChanged: true },
        tasks: { list: {}, cancel: {}, requests: { tools: { call: {} } } },
      },
      taskStore: meshTaskStore(mesh, tenant),
      defaultTaskPollInterval: TASK_POLL_INTERVAL_MS,
    },
  );

  // The request being cancelled may be served by another replica: its mesh call is named by the
  // MCP session and request id, so the cancellation reaches it from here (a call with its own
  // idempotency key is named by the key instead, and is cancelled only where it is served).
  server.setNotificationHandler(CancelledNotificationSchema, async (notification) => {
    const { requestId } = notification.params;
    if (scope.mcpSession === undefined || requestId === undefined) return;
    const served = mesh.served.get(requestKey(tenant, scope.mcpSession, requestId));
    if (served !== undefined) {
      await served.cancel().catch(() => undefined);
      return;
    }
    const id = mesh.callId(tenant, { mcpSession: scope.mcpSession, requestId });
    await mesh.cancel(tenant, id.id).catch(() => undefined);
  });

  server.setRequestHandler(ListToolsRequestSchema, async (request) => {
    try {
      return await mesh.listTools(tenant, scope.agent, request.params?.cursor);
    } catch (err) {
      throw asMcpError(err);
    }
  });

  server.setRequestHandler(CallToolRequestSchema, async (request, extra) => {
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
        ? { mcpSession: scope.mcpSession, requestId: extra.requestId }
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
      scope.mcpSession === undefined
        ? undefined
        : requestKey(tenant, scope.mcpSession, extra.requestId);
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

/** The SDK's task store, answered from the mesh's call store for one tenant. */
function meshTaskStore(mesh: MeshView, tenant: string): TaskStore {
  const notFound = (id: string): McpError =>
    new McpError(McpErrorCode.InvalidParams, `Task not found: ${id}`);
  return {
    createTask() {
      // Tasks are created by tools/call itself: the task id names the mesh call.
      return Promise.reject(
        new McpError(McpErrorCode.InternalError, "tasks start with tools/call"),
      );
    },
    async getTask(taskId) {
      return (await mesh.task(tenant, taskId)) ?? null;
    },
    storeTaskResult() {
      return Promise.reject(new McpError(McpErrorCode.InternalError, "the mesh stores results"));
    },
    async getTaskResult(taskId): Promise<Result> {
      const result = await mesh.taskResult(tenant, taskId);
      if (result === undefined) throw notFound(taskId);
      return result;
    },
    async updateTaskStatus(taskId, status) {
      if (status !== "cancelled")
        throw new McpError(McpErrorCode.InvalidParams, `a task can only be cancelled`);
      const state = await mesh.cancel(tenant, taskId);
      if (state === "unknown") throw notFound(taskId);
    },
    async listTasks(cursor) {
      try {
        return await mesh.listTasks(tenant, cursor);
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
