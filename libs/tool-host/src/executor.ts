import type { AuditTrail } from "@toolmesh/audit";
import type { NatsConnection, Subscription } from "@nats-io/nats-core";
import { SecretBox, UserSecretStore } from "./user-secrets.js";
import type { UserSecretsBucketOptions } from "./user-secrets.js";
import { DelegatedCredentials } from "./delegation.js";
import type { JetStreamClient, JetStreamManager, JsMsg } from "@nats-io/jetstream";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import pRetry from "p-retry";
import type { Subjects, TokenEndpoint, ToolDefinition } from "@toolmesh/protocol";
import {
  Defaults,
  ErrorCode,
  ToolDefinitionSchema,
  ToolmeshError,
  AbortMessageSchema,
  decodeJsonOrUndefined,
  ensureError,
  summarize,
} from "@toolmesh/protocol";
import { openCallPlane, ownerCallPlane } from "@toolmesh/call-store";
import type { CallPlane } from "@toolmesh/call-store";
import type { StreamLimits, UnavailableKind, WorkLoop } from "@toolmesh/nats";
import {
  Semaphore,
  ensureDurableConsumer,
  followStatus,
  retryWhileUnavailable,
  startWorkLoop,
  warnUnavailable,
  heartbeatMsFor,
} from "@toolmesh/nats";
import type { ToolRegistry } from "@toolmesh/registry";
import { CapacityAnnouncer } from "@toolmesh/registry";
import type { Logger, QueueReading, Tracer, ToolmeshMetrics } from "@toolmesh/telemetry";
import { toolmeshMetrics } from "@toolmesh/telemetry";
import type { ToolModule } from "./tool-module.js";
import { AttemptTelemetry } from "./attempt-telemetry.js";
import { FreshWork } from "./fresh-work.js";
import { ShutdownCode, handleWork } from "./handle-work.js";
import type { ServedTool, WorkDeps } from "./handle-work.js";

/** How often each replica purges the grants of calls that ended elsewhere, in ms. */
const GRANT_SWEEP_MS = 10 * 60_000;

/** Options of {@link startExecutor}. Durations in ms. */
export interface ExecutorOptions {
  nc: NatsConnection;
  /**
   * Where attempts and final messages are recorded (ADR 0060), in the mesh account; none when
   * undefined (an owner's executor's calls are recorded by the owner services that end them).
   */
  audit?: AuditTrail | undefined;
  subjects: Subjects;
  /** The registry, in the mesh account; unused (and may be left out) with `ownerAccount`. */
  registry?: ToolRegistry | undefined;
  tools: readonly ToolModule[];
  log: Logger;
  tracer: Tracer;
  /**
   * Registry owner identity; replicas of one deployment share it. Default `executor`; with
   * `ownerAccount`, that owner (the mesh files the tools under it whatever this says).
   */
  owner?: string;
  /**
   * The tool owner whose NATS account this executor lives in (ADR 0031). Set, it registers its
   * tools, reads records and ends calls through the mesh's owner services
   * (`{p}.v1.owner.{owner}.*`), which create its work consumers, and pulls and acks work
   * through its account's imports below the API prefix `{p}.js.API`. Unset, it uses the mesh's
   * streams and buckets directly.
   */
  ownerAccount?: string | undefined;
  /** With `ownerAccount`: how long registration waits for the owner services, in ms. Default 30 000. */
  registerWaitMs?: number;
  /** Calls run at once by this process, all tools together. Default 16. */
  concurrency?: number;
  /** Toolkit-level execution context, the lowest priority. Default `{}`. */
  toolkitContext?: Record<string, unknown>;
  /** Preset values by tool name from configuration; win over the module's own presets. */
  presets?: Record<string, Record<string, unknown>>;
  /**
   * Opens users' secrets for tools whose `credentials` are `user-secret`; the executor refuses
   * to start with such a tool and none.
   */
  secretBox?: SecretBox;
  /**
   * The authorization server's token endpoint and the mesh's client there, for tools whose
   * `credentials` are `token-exchange`; the executor refuses to start with such a tool and none.
   */
  tokenEndpoint?: TokenEndpoint;
  /**
   * Credential types of tools added after start (a bridged MCP server's, listed once it is
   * connected): what they need is opened at start, and refused then when it cannot be.
   */
  credentialTypes?: readonly ("user-secret" | "token-exchange")[];
  /**
   * With `ownerAccount`: the replicas of the bucket of users' secrets when this executor is the
   * first of its owner's to need it and makes it. Default 1.
   */
  userSecretsReplicas?: number | undefined;
  streamLimits?: StreamLimits;
  /**
   * How long a delivered call stays owned without a sign of life, in ms; heartbeats keep
   * long calls owned. After a crash the call is redelivered once this passes. Default 10 000.
   */
  ackWaitMs?: number;
  /** How long call records are kept (the idempotency horizon), in ms. Default 24 h. */
  callRetentionMs?: number;
  /**
   * Largest result, the final message's JSON, in bytes (`TOOLMESH_MAX_RESULT_BYTES`); a larger
   * one ends its call with `payload_too_large`. Held under the streams' `max_msg_size` and the
   * server's `max_payload` less 4 KiB. Default 512 KiB.
   */
  maxResultBytes?: number;
  /**
   * How long a tool's work consumer may stay unreadable for a passing reason (a leader being
   * elected) before serving the tool fails, in ms. Default `Defaults.startupTimeoutMs` (2 min).
   */
  consumerWaitMs?: number;
}

/** A running executor. */
export interface Executor {
  /** Names of the tools this executor serves (registration conflicts excluded). */
  readonly tools: readonly string[];
  /**
   * Registers and serves one more tool, or a new definition of one it serves. False when the
   * name belongs to another owner.
   */
  addTool(module: ToolModule): Promise<boolean>;
  /** Stops serving a tool (running calls finish within `graceMs`) and unregisters it. */
  removeTool(name: string, graceMs?: number): Promise<void>;
  /** Stops pulling work and waits for running calls (at most `graceMs`, default 10 s). */
  stop(graceMs?: number): Promise<void>;
  /** Keys (`callKey`) of the calls running right now. */
  inFlight(): readonly string[];
}

/** The registry entry of a tool module: preset params removed from the model's schema. */
export function toolDefinitionOf(module: ToolModule, owner: string): ToolDefinition {
  const presetNames = Object.keys(module.presets ?? {});
  return ToolDefinitionSchema.parse({
    name: module.name,
    description: module.description,
    summary: module.summary ?? summarize(module.description),
    parameters: withoutParams(module.parameters, presetNames),
    ...(module.groups === undefined ? {} : { groups: module.groups }),
    ...(module.systemParams === undefined ? {} : { system_params: module.systemParams }),
    preset_params: presetNames,
    kind: module.kind ?? "builtin",
    progress: module.progress === true,
    ...(module.annotations === undefined ? {} : { annotations: module.annotations }),
    ...(module.origin === undefined ? {} : { origin: module.origin }),
    ...(module.credentials === undefined ? {} : { credentials: module.credentials }),
    owner,
    ...(module.timeoutMs === undefined ? {} : { timeout_ms: module.timeoutMs }),
    ...(module.retry === undefined ? {} : { retry: module.retry }),
  });
}

function withoutParams(
  schema: Record<string, unknown>,
  names: readonly string[],
): Record<string, unknown> {
  if (names.length === 0) return schema;
  const hidden = new Set(names);
  const properties = Object.fromEntries(
    Object.entries((schema.properties ?? {}) as Record<string, unknown>).filter(
      ([k]) => !hidden.has(k),
    ),
  );
  const required = Array.isArray(schema.required)
    ? (schema.required as string[]).filter((k) => !hidden.has(k))
    : undefined;
  return { ...schema, properties, ...(required === undefined ? {} : { required }) };
}

/**
 * Registers the tools and consumes their work. Each tool has one durable pull consumer on
 * the work stream shared by every executor serving it, so N processes split the work. The
 * call store decides who ends a call: a redelivered call that already ended is answered from
 * its stored result and not run again.
 */
export async function startExecutor(options: ExecutorOptions): Promise<Executor> {
  return RunningExecutor.open(options);
}

/** A started executor: the tools it serves, their work loops, and what stopping releases. */
class RunningExecutor implements Executor {
  readonly #options: ExecutorOptions;
  readonly #link: MeshLink;
  readonly #deps: WorkDeps;
  readonly #metrics: ToolmeshMetrics;
  readonly #owner: string;
  readonly #workStream: string;
  readonly #slots: Semaphore;
  readonly #served = new Map<string, ServedTool>();
  readonly #loops = new Map<string, WorkLoop>();
  readonly #delegation: { stop(graceMs: number): Promise<void> } | undefined;
  readonly #stopObservingQueues: () => void;
  // Set by open as the start proceeds; only methods called once it returned use them.
  #aborts: Pick<Subscription, "unsubscribe"> | undefined;
  #capacity: CapacityAnnouncer | undefined;

  /** Takes the delegation deposits (when a tool needs them) and reports the tools' queues. */
  private constructor(
    options: ExecutorOptions,
    link: MeshLink,
    deps: WorkDeps,
    metrics: ToolmeshMetrics,
  ) {
    this.#options = options;
    this.#link = link;
    this.#deps = deps;
    this.#metrics = metrics;
    this.#owner = options.ownerAccount ?? options.owner ?? "executor";
    // An owner's tools' work waits on the owner's own work stream (ADR 0041).
    this.#workStream = options.subjects.workStream(options.ownerAccount);
    this.#slots = new Semaphore(options.concurrency ?? Defaults.concurrency);
    const { plane } = link;
    this.#delegation = deps.delegated?.serve(options.nc, options.ownerAccount, options.log, {
      records: plane.store,
      horizonMs: 2 * (options.callRetentionMs ?? Defaults.callRetentionMs),
      everyMs: GRANT_SWEEP_MS,
    });
    this.#stopObservingQueues = metrics.observeQueues(() => this.#queues());
  }

  /** Reaches the mesh, follows aborts, serves every tool, then announces its capacity. */
  static async open(options: ExecutorOptions): Promise<RunningExecutor> {
    const ackWaitMs = options.ackWaitMs ?? Defaults.ackWaitMs;
    const link = await linkToMesh(options, ackWaitMs);
    const metrics = toolmeshMetrics();
    const deps = await workDepsOf(options, link.plane, metrics, ackWaitMs);
    const executor = new RunningExecutor(options, link, deps, metrics);
    executor.#aborts = await followAborts(deps, executor.#workStream);
    for (const module of options.tools) await executor.#serve(module);
    // Resolvers size each tool's fair-share window from what its replicas announce (ADR 0055).
    executor.#capacity = new CapacityAnnouncer({
      nc: options.nc,
      subjects: options.subjects,
      owner: executor.#owner,
      concurrency: options.concurrency ?? Defaults.concurrency,
      tools: () => [...executor.#loops.keys()],
    });
    options.log.info(
      { tools: [...executor.#served.keys()], owner: executor.#owner },
      "executor started",
    );
    return executor;
  }

  /** Names of the tools this executor serves (registration conflicts excluded). */
  get tools(): readonly string[] {
    return [...this.#served.keys()];
  }

  /** Serves one more tool, or a new definition of one, and announces the change. */
  async addTool(module: ToolModule): Promise<boolean> {
    return this.#serve(module).finally(() => this.#capacity?.changed());
  }

  /** Keys (`callKey`) of the calls running right now. */
  inFlight(): readonly string[] {
    return [...this.#deps.running.keys()];
  }

  /** Stops serving a tool (running calls finish within `graceMs`) and unregisters it. */
  async removeTool(name: string, graceMs: number = Defaults.shutdownGraceMs): Promise<void> {
    const loop = this.#loops.get(name);
    this.#loops.delete(name);
    if (this.#served.delete(name)) this.#metrics.toolServed(name, -1);
    this.#capacity?.changed();
    await loop?.stop(graceMs);
    await this.#link.unregister(name, this.#owner).catch((err: unknown) => {
      this.#options.log.warn({ err, tool: name }, "cannot remove the tool from the registry");
    });
  }

  /** Stops pulling work and waits for running calls (at most `graceMs`). */
  async stop(graceMs: number = Defaults.shutdownGraceMs): Promise<void> {
    const handBack = (): void => handBackAll(this.#deps);
    this.#capacity?.stop();
    await Promise.all([...this.#loops.values()].map((loop) => loop.stop(graceMs, handBack)));
    this.#aborts?.unsubscribe();
    await this.#delegation?.stop(graceMs);
    this.#stopObservingQueues();
    for (const name of this.#served.keys()) this.#metrics.toolServed(name, -1);
  }

  /** Registers a tool and starts consuming its work; false when another owner has the name. */
  async #serve(module: ToolModule): Promise<boolean> {
    const options = this.#options;
    const definition = toolDefinitionOf(module, this.#owner);
    if (!(await registerTool(this.#link, options, definition, this.#owner))) return false;
    const tool: ServedTool = {
      module,
      definition,
      presets: { ...module.presets, ...options.presets?.[module.name] },
    };
    const previous = this.#served.get(definition.name);
    this.#served.set(definition.name, tool);
    const consumerWait = consumerWaitOf(options, definition.name);
    await retryWhileUnavailable(() => this.#link.ensureWorkConsumer(definition), {
      ...consumerWait,
      what: `ensure the work consumer of ${definition.name}`,
    });
    // A new definition of a tool already served: the running loop picks it up.
    if (previous !== undefined && this.#loops.has(definition.name)) return true;
    if (previous === undefined) this.#metrics.toolServed(definition.name, 1);
    this.#loops.set(
      definition.name,
      await startToolLoop(this.#deps, {
        stream: this.#workStream,
        js: this.#link.js,
        slots: this.#slots,
        consumerWait,
        handle: (msg) => handleWork(this.#deps, this.#served.get(definition.name) ?? tool, msg),
        tool: definition.name,
      }),
    );
    return true;
  }

  /** Each served tool's work waiting and delivered but not acked, for the metrics. */
  #queues(): Promise<QueueReading[]> {
    const { jsm } = this.#link;
    return Promise.all(
      [...this.#served.keys()].map(async (tool) => {
        const info = await jsm.consumers.info(
          this.#workStream,
          this.#options.subjects.workConsumer(tool),
        );
        return { tool, pending: info.num_pending, ackPending: info.num_ack_pending };
      }),
    );
  }
}

/** What every delivery of this executor's work is handled with. */
async function workDepsOf(
  options: ExecutorOptions,
  plane: CallPlane,
  metrics: ToolmeshMetrics,
  ackWaitMs: number,
): Promise<WorkDeps> {
  const { nc, subjects, log, tracer } = options;
  return {
    nc,
    subjects,
    plane,
    log,
    tracer,
    telemetry: new AttemptTelemetry(tracer, metrics, options.audit),
    toolkitContext: options.toolkitContext ?? {},
    ackWaitMs,
    maxResultBytes: resultLimit(nc, options),
    running: new Map(),
    inHand: new Map(),
    shutdown: new AbortController(),
    freshWork: new FreshWork(),
    userSecrets: await userSecretsFor(options),
    delegated: await delegatedFor(options, plane.clock),
  };
}

/**
 * How long and how loudly a tool's loop waits for its work consumer: right after `toolmesh
 * setup`, or while a node restarts, the consumer's leader may be being elected (the executor
 * is not ready meanwhile); one line per kind of trouble.
 */
function consumerWaitOf(options: ExecutorOptions, tool: string) {
  return {
    budgetMs: options.consumerWaitMs ?? Defaults.startupTimeoutMs,
    onRetry: (kind: UnavailableKind, err: unknown) => {
      options.log.warn(
        { tool, kind, reason: ensureError(err).message },
        `work consumer cannot be read yet (${kind}); trying again`,
      );
    },
  };
}

/** How an executor reaches the mesh: from inside its account, or from a tool owner's. */
interface MeshLink {
  plane: CallPlane;
  js: JetStreamClient;
  jsm: JetStreamManager;
  register(
    definition: ToolDefinition,
  ): Promise<
    { status: "created" | "updated" | "unchanged" } | { status: "conflict"; owner: string }
  >;
  /** Creates or updates the tool's work consumer (the mesh does it for owners' accounts). */
  ensureWorkConsumer(definition: ToolDefinition): Promise<unknown>;
  unregister(name: string, owner: string): Promise<boolean>;
}

async function linkToMesh(options: ExecutorOptions, ackWaitMs: number): Promise<MeshLink> {
  const { nc, subjects, ownerAccount } = options;
  if (ownerAccount === undefined) {
    const { registry } = options;
    if (registry === undefined)
      throw new Error("an executor in the mesh account needs the registry");
    // Its buckets' leaders may be being elected (right after setup, a node restarting).
    const plane = await retryWhileUnavailable(
      () =>
        openCallPlane(nc, {
          subjects,
          streamLimits: options.streamLimits,
          callRetentionMs: options.callRetentionMs,
          audit: options.audit,
        }),
      {
        what: "open the call store",
        budgetMs: options.consumerWaitMs ?? Defaults.startupTimeoutMs,
        onRetry: warnUnavailable(options.log, subjects.callsBucket, "bucket"),
      },
    );
    return {
      plane,
      js: plane.js,
      jsm: plane.jsm,
      register: (definition) => registry.register(definition),
      ensureWorkConsumer: (definition) =>
        ensureWorkConsumer(plane.jsm, subjects, definition, ackWaitMs),
      unregister: (name, owner) => registry.unregister(name, owner),
    };
  }
  // The account has no JetStream: its imports of the mesh's consumer API live below this prefix.
  const api = { apiPrefix: subjects.ownerJsApiPrefix, checkAPI: false };
  const plane = ownerCallPlane(nc, { subjects, owner: ownerAccount });
  return {
    plane,
    js: jetstream(nc, api),
    jsm: await jetstreamManager(nc, api),
    // The owner services may not be up yet (a resolver starting beside this executor).
    register: ({ owner: _owner, ...definition }) =>
      pRetry(() => plane.register(definition, ackWaitMs), {
        retries: Number.POSITIVE_INFINITY,
        minTimeout: 250,
        maxTimeout: 2_000,
        maxRetryTime: options.registerWaitMs ?? 30_000,
        shouldRetry: ({ error }) => ensureError(error).retryable,
        onFailedAttempt: ({ error, attemptNumber }) => {
          if (attemptNumber === 1)
            options.log.warn({ err: error }, "cannot register with the mesh yet; trying again");
        },
      }) as ReturnType<MeshLink["register"]>,
    ensureWorkConsumer: () => Promise.resolve(),
    unregister: (name) => plane.unregister(name),
  };
}

/** The tool's durable work consumer, shared by every executor serving it. */
function ensureWorkConsumer(
  jsm: JetStreamManager,
  subjects: Subjects,
  definition: ToolDefinition,
  ackWaitMs: number,
): Promise<unknown> {
  return ensureDurableConsumer(jsm, {
    stream: subjects.streams.work,
    name: subjects.workConsumer(definition.name),
    filterSubject: subjects.work(definition.name),
    ackWaitMs,
    // Crash redeliveries count as deliveries too: leave room beyond the policy's attempts.
    maxDeliver: definition.retry.max_attempts + 3,
    maxAckPending: 1_000,
  });
}

/**
 * The largest result a call may end with: the configured limit, held under what one message
 * carries (the stream's `max_msg_size`, the server's `max_payload`) less the room the call
 * record needs around it, since the record stores the final message too.
 */
function resultLimit(
  nc: NatsConnection,
  options: Pick<ExecutorOptions, "maxResultBytes" | "streamLimits">,
): number {
  const carried = Math.min(
    options.streamLimits?.maxMessageBytes ?? Defaults.maxMessageBytes,
    nc.info?.max_payload ?? Number.POSITIVE_INFINITY,
  );
  return Math.min(options.maxResultBytes ?? Defaults.maxResultBytes, carried - 4096);
}

/**
 * Aborts the attempt of a call cancelled or past its deadline: both are decided elsewhere and
 * broadcast. Resolves once the server has the subscription, from when every abort reaches this
 * process until the connection drops (which fresh work is told); unsubscribing stops both.
 */
async function followAborts(
  deps: WorkDeps,
  workStream: string,
): Promise<Pick<Subscription, "unsubscribe">> {
  const { nc, subjects, freshWork, running } = deps;
  const aborts = nc.subscribe(subjects.abortOf(workStream), {
    callback: (err, msg) => {
      if (err !== null) return;
      const body = AbortMessageSchema.safeParse(decodeJsonOrUndefined(msg.data)).data;
      if (body === undefined) return;
      freshWork.aborted(body.call_key);
      running
        .get(body.call_key)
        ?.abort(
          body.reason === "deadline_exceeded"
            ? new ToolmeshError(ErrorCode.DeadlineExceeded, "the call passed its deadline")
            : new ToolmeshError(ErrorCode.Cancelled, "the call was cancelled by its caller"),
        );
    },
  });
  await nc.flush();
  freshWork.listening();
  const stopFollowing = followStatus(nc, {
    disconnect: () => freshWork.disconnected(),
    reconnect: () => freshWork.listening(),
  });
  return {
    unsubscribe: () => {
      stopFollowing();
      aborts.unsubscribe();
    },
  };
}

/** Where and how one tool's work loop takes its work. */
interface ToolLoopOptions {
  js: JetStreamClient;
  stream: string;
  tool: string;
  slots: Semaphore;
  consumerWait: {
    budgetMs: number;
    onRetry: (kind: UnavailableKind, err: unknown) => void;
  };
  handle: (msg: JsMsg) => Promise<void>;
}

/** Starts the work loop of one tool on its work consumer. */
function startToolLoop(deps: WorkDeps, o: ToolLoopOptions): Promise<WorkLoop> {
  const { subjects, log, freshWork, ackWaitMs } = deps;
  return startWorkLoop({
    js: o.js,
    stream: o.stream,
    consumer: subjects.workConsumer(o.tool),
    slots: o.slots,
    // Buffered messages are kept owned by heartbeats while they wait for a slot.
    maxMessages: 8,
    heartbeatMs: heartbeatMsFor(ackWaitMs),
    consumerWaitMs: o.consumerWait.budgetMs,
    onConsumerUnavailable: o.consumerWait.onRetry,
    handle: o.handle,
    onError: (err) => {
      freshWork.interrupted();
      log.error({ err, tool: o.tool }, "work loop error");
    },
  });
}

/** Aborts every attempt running, so that the work loops hand their calls back. */
function handBackAll({ shutdown, running }: WorkDeps): void {
  shutdown.abort(new ToolmeshError(ErrorCode.Unavailable, "executor shutting down"));
  for (const controller of running.values()) {
    controller.abort(
      new ToolmeshError(ErrorCode.Unavailable, "executor shutting down", {
        details: { [ShutdownCode]: true },
      }),
    );
  }
}

/**
 * Registers a tool's definition; false when another owner has the name. A registration is
 * idempotent: one whose answer was lost in an election is made again.
 */
async function registerTool(
  link: MeshLink,
  options: ExecutorOptions,
  definition: ToolDefinition,
  owner: string,
): Promise<boolean> {
  const { log, subjects } = options;
  const outcome = await retryWhileUnavailable(() => link.register(definition), {
    what: `register ${definition.name}`,
    budgetMs: options.consumerWaitMs ?? Defaults.startupTimeoutMs,
    onRetry: warnUnavailable(log, subjects.registryBucket, "bucket"),
  });
  if (outcome.status !== "conflict") return true;
  if (options.ownerAccount !== undefined)
    log.warn(
      { tool: definition.name, owner: outcome.owner, refused: owner },
      "tool name already registered by another owner; registration refused",
    );
  return false; // inside the mesh the registry has logged the warning
}

/**
 * The keys that seal users' secrets (`TOOLMESH_SECRET_KEYS`) and the token endpoint, as
 * executor options, from the runtime's configuration.
 */
export function credentialSources(config: {
  secretKeys?: string | undefined;
  tokenEndpoint?: TokenEndpoint | undefined;
  streamReplicas?: number | undefined;
}): Pick<ExecutorOptions, "secretBox" | "tokenEndpoint" | "userSecretsReplicas"> {
  return {
    userSecretsReplicas: config.streamReplicas,
    ...(config.secretKeys === undefined
      ? {}
      : { secretBox: SecretBox.fromKeyList(config.secretKeys, "TOOLMESH_SECRET_KEYS") }),
    ...(config.tokenEndpoint === undefined ? {} : { tokenEndpoint: config.tokenEndpoint }),
  };
}

/** Whether a tool of the executor, now or added later, acts with credentials of `type`. */
function declares(options: ExecutorOptions, type: "user-secret" | "token-exchange"): boolean {
  return (
    options.credentialTypes?.includes(type) === true ||
    options.tools.some((t) => t.credentials?.type === type)
  );
}

/** The store of users' secrets when a tool needs them. */
async function userSecretsFor(options: ExecutorOptions): Promise<UserSecretStore | undefined> {
  if (!declares(options, "user-secret")) return undefined;
  if (options.secretBox === undefined)
    throw new Error(
      "a tool declares credentials of type user-secret: set TOOLMESH_SECRET_KEYS to the keys that seal users' secrets",
    );
  return UserSecretStore.open(options.nc, options.subjects, options.secretBox, bucketOf(options));
}

/** In a tool owner's account the executor makes the bucket if none of its owner's did yet. */
function bucketOf(options: ExecutorOptions): UserSecretsBucketOptions {
  return options.ownerAccount === undefined
    ? {}
    : { create: true, replicas: options.userSecretsReplicas };
}

/** Delegated credentials when a tool acts with a token exchange. */
async function delegatedFor(
  options: ExecutorOptions,
  clock: CallPlane["clock"],
): Promise<DelegatedCredentials | undefined> {
  if (!declares(options, "token-exchange")) return undefined;
  if (options.secretBox === undefined || options.tokenEndpoint === undefined)
    throw new Error(
      "a tool declares credentials of type token-exchange: set TOOLMESH_SECRET_KEYS and TOOLMESH_TOKEN_URL, TOOLMESH_TOKEN_CLIENT_ID, TOOLMESH_TOKEN_CLIENT_SECRET",
    );
  return DelegatedCredentials.open(
    options.nc,
    options.subjects,
    options.secretBox,
    options.tokenEndpoint,
    clock,
    bucketOf(options),
  );
}
