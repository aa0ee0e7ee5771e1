import { z } from "zod";
import type { Logger } from "@toolmesh/telemetry";
import type { CallerIdentity } from "@toolmesh/protocol";
import {
  ErrorCode,
  issuesLine,
  RetryPolicySchema,
  ToolCredentialsSchema,
  ToolKindSchema,
  ToolmeshError,
} from "@toolmesh/protocol";

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
  /**
   * Who the call acts for (issuer, subject, tenant, actor chain), as the gateway verified it or
   * the tenant's frontend stated it; absent for calls submitted without one.
   */
  readonly identity?: CallerIdentity;
  /**
   * The credential the tool acts with for this caller, when its definition declares
   * `credentials` of type `user-secret` (the secret the user registered) or `token-exchange`
   * (an access token for the declared audience, issued for the user when the call runs).
   * Never log it.
   */
  readonly credential?: string;
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
 * The one tool-definition shape every tool source produces: what the registry shows
 * (name, description, schema, groups, hints) and how the tool is invoked (`handler`).
 * {@link ToolModule} is derived from it. Durations in ms.
 */
export const ToolModuleSchema = z.object({
  name: z.string().min(1).max(128),
  description: z.string(),
  /** One line for the compact catalog; default the description's first sentence. */
  summary: z.string().optional(),
  /** JSON Schema (2020-12) of the arguments, an object schema. */
  parameters: z.record(z.string(), z.unknown()),
  /** Groups the tool belongs to. Default `["default"]`. */
  groups: z.array(z.string().min(1)).optional(),
  /** Params the resolver skips. Default `["executor", "storage"]`. */
  systemParams: z.array(z.string()).optional(),
  /**
   * Hidden params injected at execution, winning over the model's; their names are removed
   * from the schema models see, their values never leave the executor.
   */
  presets: z.record(z.string(), z.unknown()).optional(),
  /** Per-attempt timeout, in ms. Default 30 000. */
  timeoutMs: z.number().int().positive().optional(),
  /** Retry policy (snake_case, as on the wire). */
  retry: RetryPolicySchema.partial().optional(),
  /** Invokes the tool. Sync or async; any return value becomes the result's `content`. */
  handler: z.custom<ToolHandler>((v) => typeof v === "function", "handler must be a function"),
  /**
   * Resolves once the tool can take a call (the MCP bridge: its server is connected, after a
   * restart too). Each attempt waits for it before its timeout starts, so a restart does not
   * eat the attempt; `signal` aborts at the call's deadline. A rejection ends the attempt with
   * its error (`unavailable` retries). Default: always ready.
   */
  ready: z
    .custom<(signal: AbortSignal) => Promise<void>>((v) => typeof v === "function")
    .optional(),
  /** Who serves it: `builtin` (default), `native` (HTTP API) or `mcp`. */
  kind: ToolKindSchema.optional(),
  /**
   * Whether the handler emits progress (`ctx.emit`); registered as `progress` so frontends
   * know what to expect. Default `false`: emits of a tool that did not declare it are dropped.
   */
  progress: z.boolean().optional(),
  /** Hints for people and models (MCP tool annotations). */
  annotations: z.record(z.string(), z.unknown()).optional(),
  /** Where the tool comes from (server, file, URL). Never secrets. */
  origin: z.record(z.string(), z.unknown()).optional(),
  /**
   * What the tool acts with downstream. With `user-secret` or `token-exchange`, the handler
   * gets the calling user's credential as `ctx.credential`, and a call without one ends
   * `credential_required`.
   */
  credentials: ToolCredentialsSchema.optional(),
});

/**
 * A tool as every source defines it (a builtin module default-exports one; a plain object is
 * enough, no import needed). Derived from {@link ToolModuleSchema}: `A` types the handler's
 * arguments.
 */
export type ToolModule<A = Record<string, unknown>> = Omit<
  z.input<typeof ToolModuleSchema>,
  "handler"
> & {
  handler: ToolHandler<A>;
};

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
        throw new ToolmeshError(ErrorCode.InvalidParameters, issuesLine(parsed.error), {
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
