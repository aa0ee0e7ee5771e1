import { createHash, randomUUID } from "node:crypto";
import type { NatsConnection } from "@nats-io/nats-core";
import type { CallToolResult, Task, Tool } from "@modelcontextprotocol/server";
import type { Catalog, CallHandle } from "@toolmesh/client";
import { ToolmeshClient } from "@toolmesh/client";
import { ApprovalsAtRest } from "@toolmesh/call-store";
import type { CallStore, DatedRecord, WaitingApproval } from "@toolmesh/call-store";
import type {
  ApprovalReply,
  ApprovalRequiredEvent,
  CallerIdentity,
  ProgressEvent,
  Subjects,
  ToolMessage,
} from "@toolmesh/protocol";
import { ErrorCode, ToolmeshError, ensureError } from "@toolmesh/protocol";
import type { ToolRegistry } from "@toolmesh/registry";
import type { Principal, ToolNames } from "./auth.js";
import type { CallDelegation, ConsentNeeded } from "./delegation.js";
import { toCallToolResult } from "./results.js";
import { shownMessage } from "./tool-names.js";

/** `_meta` key of a call's whole budget in ms. */
export const META_TIMEOUT_MS = "io.toolmesh/timeout_ms";
/** `_meta` key of a call's idempotency key: the same key within a tenant runs the call once. */
export const META_IDEMPOTENCY_KEY = "io.toolmesh/idempotency_key";

/** Tools listed per `tools/list` page (the most one describe request answers). */
export const PAGE_SIZE = 64;

/** How often a client is told to poll a task, in ms. */
export const TASK_POLL_INTERVAL_MS = 500;

/** Options of {@link MeshView}. Durations in ms. */
export interface MeshViewOptions {
  nc: NatsConnection;
  subjects: Subjects;
  prefix: string;
  registry: ToolRegistry;
  /** The call records. */
  calls: CallStore;
  /** Budget of a call whose `_meta` sets none, in ms. */
  defaultTimeoutMs: number;
  /** How long the mesh keeps call records (a task's ttl), in ms. */
  retentionMs: number;
  /** Obtains the delegation grants of `token-exchange` tools' calls; none without a token endpoint. */
  delegation?: CallDelegation;
}

/** How a gateway call is named in the mesh: its session, call id and idempotency key are one id. */
export interface MeshCallId {
  readonly id: string;
}

/** A submitted gateway call. */
export interface MeshCallHandle extends CallHandle {
  /**
   * Stops following the call here (its session closes; the call itself goes on in the mesh):
   * for a call that waits for a person, whose answer a later request takes.
   */
  release(): void;
}

/**
 * The mesh as the gateway uses it: one TypeScript client per tenant (the gateway acts for the
 * tenants it authenticated), the catalog and describe RPCs for `tools/list`, sessions for calls,
 * and the call store for tasks. Holds nothing a second replica would need.
 */
export class MeshView {
  readonly #o: MeshViewOptions;
  readonly #clients = new Map<string, ToolmeshClient>();
  /**
   * Synchronous calls this replica serves, by tenant, MCP session and request id: the exchange it
   * holds open, so a cancellation of a call named by its own key (not derivable from the request
   * id) still reaches it when it arrives here.
   */
  readonly served = new Map<string, CallHandle>();
  #approvals: Promise<ApprovalsAtRest> | undefined;

  constructor(options: MeshViewOptions) {
    this.#o = options;
  }

  /** The client acting for `tenant`. */
  client(tenant: string): ToolmeshClient {
    let client = this.#clients.get(tenant);
    if (client === undefined) {
      client = new ToolmeshClient(this.#o.nc, {
        prefix: this.#o.prefix,
        tenant,
        defaultTimeoutMs: this.#o.defaultTimeoutMs,
        // A session per call: one subscription per tenant spares the server a subscribe and an
        // unsubscribe per call.
        tenantSubscription: true,
        // Calls count against the tenant's own bound when it has a calls stream (ADR 0048).
        tenantStream: true,
      });
      this.#clients.set(tenant, client);
    }
    return client;
  }

  /**
   * One page of the tenant's tools (the agent's, with its groups applied) with full input
   * schemas. `cursor` is the offset of the page, as {@link encodeCursor} wrote it.
   */
  async listTools(
    tenant: string,
    view: {
      agent: string | undefined;
      names: ToolNames;
      cursor: string | undefined;
      /** Who the list is for: policies decide with its subject, as for the caller's calls. */
      identity?: CallerIdentity | undefined;
    },
  ): Promise<{ tools: Tool[]; nextCursor?: string }> {
    const { agent, names, cursor, identity } = view;
    const who = {
      ...(agent === undefined ? {} : { agent }),
      ...(identity === undefined ? {} : { identity }),
    };
    const client = this.client(tenant);
    const offset = cursor === undefined ? 0 : decodeCursor(cursor);
    const catalog: Catalog = await client.catalog({
      ...(names === "mesh" ? {} : { names }),
      ...who,
    });
    const page = catalog.tools.slice(offset, offset + PAGE_SIZE);
    const tools: Tool[] = [];
    if (page.length > 0) {
      // describe records what it sent under its session; this one is the gateway's own.
      const session = client.session(`mcp-catalog`);
      try {
        // With provider-safe names, `name` is what the client is shown and `tool` the mesh name.
        const meshName = (entry: Catalog["tools"][number]): string => entry.tool ?? entry.name;
        const { schemas } = await session.describe(page.map(meshName), who);
        const byName = new Map(schemas.map((s) => [s.tool, s]));
        for (const entry of page) {
          const schema = byName.get(meshName(entry));
          if (schema === undefined) continue; // switched off or removed meanwhile
          const annotations = this.#o.registry.get(meshName(entry))?.definition.annotations;
          tools.push({
            name: entry.name,
            description: schema.description,
            inputSchema: { ...schema.parameters, type: "object" },
            ...(annotations === undefined ? {} : { annotations: annotations }),
            execution: { taskSupport: "optional" },
          });
        }
      } finally {
        session.close();
      }
    }
    const next = offset + PAGE_SIZE;
    return next < catalog.tools.length ? { tools, nextCursor: encodeCursor(next) } : { tools };
  }

  /**
   * The mesh name of the tool a call names. Served provider-safe names, a client calls by the
   * safe name, which the registry maps back; a name it does not know goes to the mesh as it is
   * (answered `unknown_tool`).
   */
  meshName(name: string, names: ToolNames): string {
    if (names === "mesh") return name;
    return this.#o.registry.toolOfSafeName(name) ?? name;
  }

  /** The mesh id of a call: from the caller's idempotency key, else from the MCP request. */
  callId(
    tenant: string,
    options: {
      idempotencyKey?: string;
      mcpSession?: string;
      requestId?: string | number;
      credential?: string;
    },
  ): MeshCallId {
    if (options.idempotencyKey !== undefined)
      return { id: `mcp-k-${digest(`${tenant}\n${options.idempotencyKey}`)}` };
    if (options.mcpSession !== undefined && options.requestId !== undefined)
      return {
        id: `mcp-r-${digest(`${tenant}\n${options.mcpSession}\n${String(options.requestId)}`)}`,
      };
    const uuid = randomUUID();
    if (options.credential === undefined) return { id: `mcp-t-${uuid}` };
    return { id: `mcp-t-${uuid}-${bindingTag(tenant, options.credential, uuid)}` };
  }

  /**
   * Whether a call id is one the credential may see as a task: an id made for a credential
   * (`mcp-t-{uuid}-{tag}`) only by that credential; an id named by an idempotency key or a
   * request is shared by the tenant (the key is the tenant's).
   */
  boundTo(tenant: string, credential: string, id: string): boolean {
    const bound = /^mcp-t-([0-9a-f-]{36})-([0-9a-f]{16})$/.exec(id);
    if (bound === null) return true;
    return bound[2] === bindingTag(tenant, credential, bound[1] ?? "");
  }

  /**
   * Obtains what lets the call act later for its caller, before it is submitted: the
   * delegation grant of a tool declaring `token-exchange` credentials (ADR 0063). Answers what
   * the caller must consent to when the authorization server refused the exchange.
   */
  async delegate(
    id: MeshCallId,
    name: string,
    principal: Principal,
  ): Promise<ConsentNeeded | undefined> {
    return this.#o.delegation?.prepare(id.id, this.#o.registry.get(name)?.definition, principal);
  }

  /**
   * Submits a call. `onProgress` sees each progress event; the handle's result settles with the
   * final message. The session is closed once the call ends.
   */
  submit(
    tenant: string,
    id: MeshCallId,
    call: {
      name: string;
      arguments: Record<string, unknown>;
      agent?: string;
      /** Who the call acts for: the caller's verified identity. */
      identity?: CallerIdentity;
      timeoutMs?: number;
      onProgress?: (event: ProgressEvent) => void;
      /** The call was accepted and waits for a person. */
      onApproval?: (event: ApprovalRequiredEvent) => void;
    },
  ): MeshCallHandle {
    const session = this.client(tenant).session(id.id);
    const { onProgress, onApproval } = call;
    if (onProgress !== undefined || onApproval !== undefined) {
      session.onEvent((event) => {
        if (event.type === "progress") onProgress?.(event.event);
        else if (event.type === "approval") onApproval?.(event.event);
      });
    }
    const handle = session.submit(
      { id: id.id, name: call.name, arguments: call.arguments },
      {
        idempotencyKey: id.id,
        timeoutMs: call.timeoutMs ?? this.#o.defaultTimeoutMs,
        ...(call.agent === undefined ? {} : { agent: call.agent }),
        ...(call.identity === undefined ? {} : { identity: call.identity }),
      },
    );
    void handle.result.finally(() => session.close());
    return { ...handle, release: () => session.close() };
  }

  /**
   * The caller's answer for a call of `tenant` that waits for its caller's confirmation: the
   * same confirm request a NATS frontend sends for its session (ADR 0059).
   */
  async confirm(tenant: string, id: string, confirm: boolean): Promise<ApprovalReply> {
    const session = this.client(tenant).session(id);
    try {
      return await session.confirm(id, confirm, { idempotencyKey: id });
    } finally {
      session.close();
    }
  }

  /**
   * The approval a gateway call waits for (or was just given and not yet routed), read from the
   * approvals bucket: what any replica sees, after any restart.
   */
  async waiting(tenant: string, id: string): Promise<WaitingApproval | undefined> {
    if (!isMeshCallId(id)) return undefined;
    const client = this.client(tenant);
    this.#approvals ??= ApprovalsAtRest.bind(this.#o.nc, this.#o.subjects);
    let approvals: ApprovalsAtRest;
    try {
      approvals = await this.#approvals;
    } catch (err) {
      // No resolver made the bucket yet: nothing waits; bind again next time.
      this.#approvals = undefined;
      if (isMissingBucket(err)) return undefined;
      throw err;
    }
    return approvals.waiting(this.#o.subjects.address(client.tenant, id), id);
  }

  /** Cancels a call by its mesh id; `state` is what the mesh says of it. */
  async cancel(tenant: string, id: string): Promise<string> {
    const session = this.client(tenant).session(id);
    try {
      const reply = await session.cancel(id, id);
      return reply.state;
    } finally {
      session.close();
    }
  }

  /**
   * Waits until the mesh accepted a call (its record exists) or answered it (a final message):
   * a task is created only for a call the call store can answer for.
   */
  async awaitAccepted(tenant: string, handle: CallHandle, timeoutMs: number): Promise<void> {
    let settled = false;
    void handle.result.then(() => {
      settled = true;
    });
    const until = Date.now() + timeoutMs;
    for (let delay = 5; !settled; delay = Math.min(delay * 2, 100)) {
      if ((await this.record(tenant, handle.callId)) !== undefined) return;
      // Accepted and waiting for a person: stored in the approvals bucket until decided.
      if ((await this.waiting(tenant, handle.callId)) !== undefined) return;
      if (Date.now() > until)
        throw new ToolmeshError(ErrorCode.Unavailable, "the mesh did not accept the call in time");
      await new Promise((resolve) => setTimeout(resolve, delay));
    }
  }

  /** The record of a gateway call, with the times of its first and latest revision. */
  async record(tenant: string, id: string): Promise<DatedRecord | undefined> {
    if (!isMeshCallId(id)) return undefined;
    const client = this.client(tenant);
    return this.#o.calls.dated({
      address: this.#o.subjects.address(client.tenant, id),
      idempotency_key: id,
    });
  }

  /**
   * The MCP task of a gateway call, its status message naming tools as `names` says; undefined
   * when the tenant has no such call.
   */
  async task(tenant: string, id: string, names: ToolNames): Promise<Task | undefined> {
    const found = await this.record(tenant, id);
    if (found !== undefined) return this.#toTask(id, found, names);
    const waiting = await this.waiting(tenant, id);
    return waiting === undefined ? undefined : this.#waitingTask(id, waiting);
  }

  /** The tenant's gateway tasks, newest keys last, a page at a time. */
  async listTasks(
    tenant: string,
    cursor: string | undefined,
    names: ToolNames,
  ): Promise<{ tasks: Task[]; nextCursor?: string }> {
    const address = this.#o.subjects.address(tenant, "x");
    const keys = (await this.#o.calls.callsOf(address.tenant))
      .filter(({ session, key }) => session === key && isMeshCallId(session))
      .map(({ session }) => session)
      .sort();
    const offset = cursor === undefined ? 0 : decodeCursor(cursor);
    const tasks: Task[] = [];
    for (const id of keys.slice(offset, offset + PAGE_SIZE)) {
      const task = await this.task(tenant, id, names);
      if (task !== undefined) tasks.push(task);
    }
    const next = offset + PAGE_SIZE;
    return next < keys.length ? { tasks, nextCursor: encodeCursor(next) } : { tasks };
  }

  /** The tool result of an ended gateway call, naming tools as `names` says. */
  async taskResult(
    tenant: string,
    id: string,
    names: ToolNames,
  ): Promise<CallToolResult | undefined> {
    const found = await this.record(tenant, id);
    if (found?.record.result === undefined) return undefined;
    return toCallToolResult(found.record.result, names);
  }

  /**
   * The task of a call that waits for a person (it has no record until decided): the caller's
   * confirmation is `input_required` (answered by `tasks/update`), an operator's is `working`
   * with a message saying who decides it and how.
   */
  #waitingTask(id: string, waiting: WaitingApproval): Task {
    const until = new Date(waiting.expiresAt).toISOString();
    const status: Task["status"] =
      waiting.state === "waiting" && waiting.kind === "caller" ? "input_required" : "working";
    const statusMessage =
      waiting.state === "approved"
        ? "approved: it runs next"
        : waiting.kind === "caller"
          ? `waits for the caller's confirmation until ${until}: answer with tasks/update`
          : `waits for an operator's or the tenant approver's decision until ${until} (toolmesh approvals approve ${waiting.approvalId})`;
    const at = new Date(waiting.requestedAt).toISOString();
    return {
      taskId: id,
      status,
      ttl: this.#o.retentionMs,
      createdAt: at,
      lastUpdatedAt: at,
      pollInterval: TASK_POLL_INTERVAL_MS,
      statusMessage,
    };
  }

  #toTask(id: string, found: DatedRecord, names: ToolNames): Task {
    const { record } = found;
    const result: ToolMessage | undefined =
      record.result === undefined ? undefined : shownMessage(record.result, names);
    let status: Task["status"] = "working";
    let statusMessage: string | undefined;
    if (record.state === "done" && result !== undefined) {
      if (result.error === undefined) status = "completed";
      else if (result.error.code === ErrorCode.Cancelled) status = "cancelled";
      else status = "failed";
      if (result.error !== undefined)
        statusMessage = `${result.error.code}: ${result.error.message}`;
    }
    return {
      taskId: id,
      status,
      ttl: this.#o.retentionMs,
      createdAt: found.createdAt.toISOString(),
      lastUpdatedAt: found.updatedAt.toISOString(),
      pollInterval: TASK_POLL_INTERVAL_MS,
      ...(statusMessage === undefined ? {} : { statusMessage }),
    };
  }
}

/** Whether a bind failed because the bucket does not exist (yet). */
function isMissingBucket(err: unknown): boolean {
  return err instanceof Error && /not found|does not exist/i.test(err.message);
}

/** The key of a served request in {@link MeshView.served}. */
export function requestKey(tenant: string, mcpSession: string, requestId: string | number): string {
  return JSON.stringify([tenant, mcpSession, requestId]);
}

/** Whether `id` is the shape of a gateway call id (and so a safe subject token). */
export function isMeshCallId(id: string): boolean {
  return /^mcp-[krt]-[0-9a-f-]{36,53}$/.test(id);
}

/** What binds a task id to the tenant and credential that made it. */
function bindingTag(tenant: string, credential: string, uuid: string): string {
  return digest(`${tenant}\n${credential}\n${uuid}`).slice(0, 16);
}

function digest(text: string): string {
  return createHash("sha256").update(text, "utf8").digest("hex").slice(0, 40);
}

/** An opaque paging cursor for an offset. */
export function encodeCursor(offset: number): string {
  return Buffer.from(JSON.stringify({ o: offset })).toString("base64url");
}

/** The offset of a cursor; throws `invalid_request` for one this gateway did not write. */
export function decodeCursor(cursor: string): number {
  try {
    const value = JSON.parse(Buffer.from(cursor, "base64url").toString("utf8")) as { o?: unknown };
    if (typeof value.o === "number" && Number.isInteger(value.o) && value.o >= 0) return value.o;
  } catch {
    // reported below
  }
  throw new ToolmeshError(ErrorCode.InvalidRequest, "not a cursor this gateway wrote");
}

/** A thrown value as a typed error (for logs and replies). */
export function asError(err: unknown): ToolmeshError {
  return ensureError(err, ErrorCode.Internal);
}
