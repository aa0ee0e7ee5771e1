import { z } from "zod";
import type { Logger } from "@toolmesh/telemetry";
import { ErrorCode, RetryPolicySchema, ToolKindSchema, ToolmeshError } from "@toolmesh/protocol";
import type { ToolKind } from "@toolmesh/protocol";

/** What a handler receives besides its arguments. */
export interface ToolContext {
  /** The call id (the model's tool call id). */
  readonly callId: string;
  /**
   * Stable across redeliveries and resubmissions: key your side effects on it. The call's
   * idempotency key scoped by where it came from, `{tenant token}/{session token}/{key}`, so
   * two tenants (or sessions) using the same key never share it.
   */
  readonly idempotencyKey: string;
  readonly sessionId: string;
  readonly tool: string;
  /** Delivery attempt, counting from 1. */
  readonly attempt: number;
  /** Merged execution context: call-level over agent-level over toolkit-level. */
  readonly context: Readonly<Record<string, unknown>>;
  /** Aborted when the attempt times out, the deadline passes or the call is cancelled. */
  readonly signal: AbortSignal;
  /** Epoch ms (this host's clock) at which the call's deadline passes. */
  readonly deadlineAt: number;
  /** Sends a progress event to the caller's session. Never throws. */
  emit(progress: unknown): void;
  /** Logger carrying callId, sessionId and tool. */
  readonly log: Logger;
}

/** A tool handler. Sync or async; any return value becomes the result's `content`. */
export type ToolHandler<A = Record<string, unknown>> = (args: A, ctx: ToolContext) => unknown;

/**
 * A builtin tool as a module default-exports it. A plain object is enough: no import needed.
 * Durations in ms.
 */
export interface ToolModule<A = Record<string, unknown>> {
  name: string;
  description: string;
  /** One line for the compact catalog; default the description's first sentence. */
  summary?: string;
  /** JSON Schema (2020-12) of the arguments, an object schema. */
  parameters: Record<string, unknown>;
  /** Groups the tool belongs to. Default `["default"]`. */
  groups?: string[];
  /** Params the resolver skips. Default `["executor", "storage"]`. */
  systemParams?: string[];
  /**
   * Hidden params injected at execution, winning over the model's; their names are removed
   * from the schema models see, their values never leave the executor.
   */
  presets?: Record<string, unknown>;
  /** Per-attempt timeout, in ms. Default 30 000. */
  timeoutMs?: number;
  /** Retry policy (snake_case, as on the wire). */
  retry?: z.input<typeof RetryPolicySchema>;
  handler: ToolHandler<A>;
  /**
   * Resolves once the tool can take a call (the MCP bridge: its server is connected, after a
   * restart too). Each attempt waits for it before its timeout starts, so a restart does not
   * eat the attempt; `signal` aborts at the call's deadline. A rejection ends the attempt with
   * its error (`unavailable` retries). Default: always ready.
   */
  ready?: (signal: AbortSignal) => Promise<void>;
  /** Who serves it: `builtin` (default), `native` (HTTP API) or `mcp`. */
  kind?: ToolKind;
  /**
   * Whether the handler emits progress (`ctx.emit`); registered as `progress` so frontends
   * know what to expect. Default `false`: emits of a tool that did not declare it are dropped.
   */
  progress?: boolean;
  /** Hints for people and models (MCP tool annotations). */
  annotations?: Record<string, unknown>;
  /** Where the tool comes from (server, file, URL). Never secrets. */
  origin?: Record<string, unknown>;
}

/** Checks the shape of a loaded module's default export. */
export const ToolModuleSchema = z.object({
  name: z.string().min(1).max(128),
  description: z.string(),
  summary: z.string().optional(),
  parameters: z.record(z.string(), z.unknown()),
  groups: z.array(z.string().min(1)).optional(),
  systemParams: z.array(z.string()).optional(),
  presets: z.record(z.string(), z.unknown()).optional(),
  timeoutMs: z.number().int().positive().optional(),
  retry: RetryPolicySchema.partial().optional(),
  handler: z.custom<ToolHandler>((v) => typeof v === "function", "handler must be a function"),
  kind: ToolKindSchema.optional(),
  progress: z.boolean().optional(),
  annotations: z.record(z.string(), z.unknown()).optional(),
  origin: z.record(z.string(), z.unknown()).optional(),
});

/** Options of {@link defineTool}: a zod object schema types the handler's arguments. */
export type DefineToolOptions<S extends z.ZodObject> = Omit<
  ToolModule<z.output<S>>,
  "parameters" | "handler"
> & {
  input: S;
  handler: ToolHandler<z.output<S>>;
};

/**
 * Defines a tool whose arguments are typed by a zod object schema. The JSON Schema shown to
 * models is generated from it; the handler receives arguments parsed by it.
 */
export function defineTool<S extends z.ZodObject>(options: DefineToolOptions<S>): ToolModule {
  const { input, handler, ...rest } = options;
  const parameters = z.toJSONSchema(input, { target: "draft-2020-12", io: "input" }) as Record<
    string,
    unknown
  >;
  delete parameters.$schema;
  return {
    ...rest,
    parameters,
    handler: (args, ctx) => {
      const parsed = input.safeParse(args);
      if (!parsed.success) {
        // The resolver validated against the same schema; this is a refinement it cannot
        // express in JSON Schema. Trying again would fail the same way.
        throw new ToolmeshError(ErrorCode.InvalidParameters, z.prettifyError(parsed.error), {
          retryable: false,
          details: {
            errors: parsed.error.issues.map((i) => ({
              path: `/${i.path.join("/")}`,
              message: i.message,
            })),
          },
        });
      }
      return handler(parsed.data, ctx);
    },
  };
}
