import { createHash } from "node:crypto";
import type { KV } from "@nats-io/kv";
import { KvWatchInclude } from "@nats-io/kv";
import { jetstreamManager } from "@nats-io/jetstream";
import type { NatsConnection } from "@nats-io/nats-core";
import type { Tool } from "@modelcontextprotocol/client";
import { z } from "zod";
import { ErrorCode, ToolmeshError, decodeJsonOrUndefined, encodeJson } from "@toolmesh/protocol";
import type { Subjects } from "@toolmesh/protocol";
import type { MeshSettings } from "@toolmesh/nats";
import { meshPlan, openBucket } from "@toolmesh/nats";

/** A tool definition as pinned: what the hash covers, and the hash. */
const DefinitionSchema = z.object({
  sha256: z.string(),
  description: z.string(),
  inputSchema: z.record(z.string(), z.unknown()),
});

const ApprovedSchema = DefinitionSchema.extend({
  approved_at: z.number(),
  /** `first use` (pinned when the server was first listed) or `toolmesh tools approve`. */
  approved_by: z.string(),
});

const PendingSchema = DefinitionSchema.extend({
  /** When a bridge first saw this definition, ms since the epoch. */
  seen_at: z.number(),
});

/** The approvals of one server: key `<server>` of the `{p}_tool_approvals` bucket. */
export const ServerApprovalsSchema = z.object({
  server: z.string(),
  /** Approved definitions by MCP tool name: only these are served. */
  tools: z.record(z.string(), ApprovedSchema),
  /** Definitions the server lists that wait for approval, by MCP tool name. */
  pending: z.record(z.string(), PendingSchema),
  updated_at: z.number(),
});

/** The approvals of one server. */
export type ServerApprovals = z.infer<typeof ServerApprovalsSchema>;

/** One tool a pinned server lists with a definition nobody approved. */
export interface UnapprovedTool {
  tool: string;
  /** `changed` (its approved definition differs) or `new` (never approved). */
  change: "changed" | "new";
  /** Which parts differ from the approved definition. */
  fields: ("description" | "inputSchema")[];
  sha256: string;
  approved_sha256?: string;
}

/** What {@link ToolPins.check} found. */
export interface PinCheck {
  /** MCP names of the tools that may be served. */
  approved: Set<string>;
  unapproved: UnapprovedTool[];
  /** The server had no approvals: every listed tool was pinned as it is. */
  pinnedOnFirstUse: boolean;
}

/** One tool approved by {@link ToolPins.approve}. */
export interface ApprovedTool {
  tool: string;
  sha256: string;
  previous_sha256?: string;
  fields: ("description" | "inputSchema")[];
}

/**
 * The hash a tool definition is pinned by: SHA-256 of the canonical JSON (keys sorted) of
 * `{description, inputSchema}`.
 */
export function toolHash(tool: Pick<Tool, "description" | "inputSchema">): string {
  return createHash("sha256")
    .update(canonicalJson({ description: tool.description ?? "", inputSchema: tool.inputSchema }))
    .digest("hex");
}

function canonicalJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`;
  if (typeof value === "object" && value !== null) {
    const entries = Object.entries(value as Record<string, unknown>)
      .filter(([, v]) => v !== undefined)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonicalJson(v)}`).join(",")}}`;
  }
  return JSON.stringify(value);
}

function changedFields(
  approved: z.infer<typeof DefinitionSchema>,
  tool: Pick<Tool, "description" | "inputSchema">,
): ("description" | "inputSchema")[] {
  const fields: ("description" | "inputSchema")[] = [];
  if (approved.description !== (tool.description ?? "")) fields.push("description");
  if (canonicalJson(approved.inputSchema) !== canonicalJson(tool.inputSchema)) {
    fields.push("inputSchema");
  }
  return fields;
}

/**
 * Approved MCP tool definitions, pinned by hash in the KV bucket `{p}_tool_approvals` (one key
 * per server, updated by compare-and-set so bridge replicas and the CLI never lose each other's
 * writes). See ADR 0014.
 */
export class ToolPins {
  readonly #kv: KV;

  private constructor(kv: KV) {
    this.#kv = kv;
  }

  /** Opens (creating when needed and allowed) the approvals bucket. */
  static async open(
    nc: NatsConnection,
    subjects: Subjects,
    settings: MeshSettings = {},
  ): Promise<ToolPins> {
    const spec = meshPlan(subjects, settings).buckets.toolApprovals;
    return new ToolPins(await openBucket(nc, await jetstreamManager(nc), spec));
  }

  /** The approvals of a server, with the revision they were read at. */
  async read(server: string): Promise<{ value: ServerApprovals; revision: number } | undefined> {
    const entry = await this.#kv.get(server);
    if (entry === null || entry.operation !== "PUT") return undefined;
    const parsed = ServerApprovalsSchema.safeParse(decodeJsonOrUndefined(entry.value));
    if (!parsed.success) {
      throw new ToolmeshError(
        ErrorCode.Internal,
        `the tool approvals of server "${server}" cannot be read; delete key "${server}" of the approvals bucket to pin again`,
      );
    }
    return { value: parsed.data, revision: entry.revision };
  }

  /**
   * Checks a server's listed tools against its approvals. A server with none yet has every
   * listed tool pinned as it is (first use). Otherwise a tool whose hash differs from its
   * approved one (or that was never approved) is not approved, and is recorded as pending.
   */
  async check(server: string, tools: readonly Tool[]): Promise<PinCheck> {
    for (;;) {
      const now = Date.now();
      const current = await this.read(server);
      if (current === undefined) {
        const record: ServerApprovals = {
          server,
          tools: Object.fromEntries(
            tools.map((t) => [
              t.name,
              {
                ...definitionOf(t),
                approved_at: now,
                approved_by: "first use",
              },
            ]),
          ),
          pending: {},
          updated_at: now,
        };
        try {
          await this.#kv.create(server, encodeJson(record));
        } catch {
          continue; // another replica pinned first: check against its record
        }
        return {
          approved: new Set(tools.map((t) => t.name)),
          unapproved: [],
          pinnedOnFirstUse: true,
        };
      }
      const { value, revision } = current;
      const approved = new Set<string>();
      const unapproved: UnapprovedTool[] = [];
      const pending: ServerApprovals["pending"] = {};
      for (const tool of tools) {
        const sha256 = toolHash(tool);
        const pinned = value.tools[tool.name];
        if (pinned?.sha256 === sha256) {
          approved.add(tool.name);
          continue;
        }
        const known = value.pending[tool.name];
        pending[tool.name] =
          known?.sha256 === sha256 ? known : { ...definitionOf(tool), seen_at: now };
        unapproved.push({
          tool: tool.name,
          change: pinned === undefined ? "new" : "changed",
          fields: pinned === undefined ? [] : changedFields(pinned, tool),
          sha256,
          ...(pinned === undefined ? {} : { approved_sha256: pinned.sha256 }),
        });
      }
      if (canonicalJson(pending) === canonicalJson(value.pending)) {
        return { approved, unapproved, pinnedOnFirstUse: false };
      }
      try {
        await this.#kv.update(server, encodeJson({ ...value, pending, updated_at: now }), revision);
        return { approved, unapproved, pinnedOnFirstUse: false };
      } catch {
        // changed meanwhile (an approval, another replica): check again
      }
    }
  }

  /**
   * Approves the pending definitions of a server: those of `tools`, or all when none is named.
   * Fails with `invalid_request` when the server has no approvals or a named tool waits for none.
   */
  async approve(
    server: string,
    tools: readonly string[],
    by = "toolmesh tools approve",
  ): Promise<ApprovedTool[]> {
    for (;;) {
      const current = await this.read(server);
      if (current === undefined) {
        throw new ToolmeshError(
          ErrorCode.InvalidRequest,
          `server "${server}" has no pinned tools (is pin_tools set in its file, and has a bridge listed it?)`,
          { details: { server } },
        );
      }
      const { value, revision } = current;
      const names = tools.length === 0 ? Object.keys(value.pending) : [...tools];
      const missing = names.filter((name) => value.pending[name] === undefined);
      if (names.length === 0 || missing.length > 0) {
        throw new ToolmeshError(
          ErrorCode.InvalidRequest,
          names.length === 0
            ? `no tool of server "${server}" waits for approval`
            : `no definition of ${missing.map((m) => `"${m}"`).join(", ")} waits for approval on server "${server}"`,
          { details: { server, waiting: Object.keys(value.pending) } },
        );
      }
      const now = Date.now();
      const next: ServerApprovals = {
        ...value,
        tools: { ...value.tools },
        pending: { ...value.pending },
        updated_at: now,
      };
      const approved: ApprovedTool[] = [];
      for (const name of names) {
        const pending = value.pending[name];
        if (pending === undefined) continue;
        const previous = value.tools[name];
        next.tools[name] = {
          sha256: pending.sha256,
          description: pending.description,
          inputSchema: pending.inputSchema,
          approved_at: now,
          approved_by: by,
        };
        delete next.pending[name];
        approved.push({
          tool: name,
          sha256: pending.sha256,
          ...(previous === undefined ? {} : { previous_sha256: previous.sha256 }),
          fields:
            previous === undefined
              ? []
              : changedFields(previous, {
                  description: pending.description,
                  inputSchema: pending.inputSchema as Tool["inputSchema"],
                }),
        });
      }
      try {
        await this.#kv.update(server, encodeJson(next), revision);
        return approved;
      } catch {
        // changed meanwhile: read again
      }
    }
  }

  /** Calls `onChange` after every change (or deletion) of a server's approvals; returns the stop function. */
  async watch(server: string, onChange: () => void): Promise<() => void> {
    const watcher = await this.#kv.watch({ key: server, include: KvWatchInclude.UpdatesOnly });
    void (async () => {
      // A deleted key pins again from scratch: the next check approves the list as it is.
      for await (const _entry of watcher) onChange();
    })();
    return () => watcher.stop();
  }
}

function definitionOf(tool: Tool): z.infer<typeof DefinitionSchema> {
  return {
    sha256: toolHash(tool),
    description: tool.description ?? "",
    inputSchema: tool.inputSchema,
  };
}
