import {
  ValueType,
  metrics,
  type Attributes,
  type Counter,
  type Histogram,
  type MeterProvider,
  type ObservableResult,
  type UpDownCounter,
} from "@opentelemetry/api";
import {
  ATTR_ERROR_TYPE,
  ATTR_GEN_AI_TOOL_NAME,
  ATTR_MCP_METHOD_NAME,
  ATTR_TOOLMESH_MCP_SERVER,
  ATTR_TOOLMESH_MCP_STATE,
  ATTR_TOOLMESH_RESOLUTION,
} from "./semconv.js";

/** Seconds; from 5 ms to 5 min, for tool calls and MCP requests. */
const DURATION_BUCKETS_S = [
  0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300,
];

/** Names of the instruments, as OpenTelemetry names them (Prometheus: dots become `_`). */
export const MetricName = {
  ToolCalls: "toolmesh.tool.calls",
  ToolAttempts: "toolmesh.tool.attempts",
  ToolRetries: "toolmesh.tool.retries",
  ToolTimeouts: "toolmesh.tool.timeouts",
  ToolCallDuration: "toolmesh.tool.call.duration",
  ToolQueueWait: "toolmesh.tool.queue.wait",
  ToolInFlight: "toolmesh.tool.in_flight",
  ToolExecutors: "toolmesh.tool.executors",
  QueuePending: "toolmesh.tool.queue.pending",
  QueueAckPending: "toolmesh.tool.queue.ack_pending",
  ResolverCalls: "toolmesh.resolver.calls",
  DeadLetters: "toolmesh.dead_letters",
  SchemaExpansions: "toolmesh.schema.expansions",
  SchemaSessions: "toolmesh.schema.sessions",
  McpServerState: "toolmesh.mcp.server.state",
  McpServerRestarts: "toolmesh.mcp.server.restarts",
  McpRequestDuration: "toolmesh.mcp.request.duration",
  TenantRefused: "toolmesh.tenant.refused",
  PolicyDecisions: "toolmesh.policy.decisions",
  AuditEvents: "toolmesh.audit.events",
  AuditWriteFailures: "toolmesh.audit.write_failures",
  AuditDropped: "toolmesh.audit.dropped",
  AuditLag: "toolmesh.audit.lag",
  ApprovalsWaiting: "toolmesh.approvals.waiting",
  ApprovalDecisionTime: "toolmesh.approvals.decision_time",
  TenantInFlight: "toolmesh.tenant.in_flight",
  TenantQueued: "toolmesh.tenant.queued",
  TenantStored: "toolmesh.tenant.stored_bytes",
  TenantStoredLimit: "toolmesh.tenant.stored_bytes.limit",
  GatewayCalls: "toolmesh.gateway.calls",
  GatewayCallDuration: "toolmesh.gateway.call.duration",
} as const;

/** Attribute naming a tenant (its token); only tenants with a quota are labelled. */
export const ATTR_TOOLMESH_TENANT = "toolmesh.tenant";
/** Attribute naming the quota that refused a call (`rate`, `max_in_flight`, `max_queued`, `daily`). */
export const ATTR_TOOLMESH_QUOTA = "toolmesh.quota";

/** What a tenant with a quota has in flight, as this process last counted it. */
export interface TenantReading {
  tenant: string;
  inFlight: number;
  queued: number;
}

/** What a tenant's calls have stored (their final messages, within the call retention). */
export interface StoredReading {
  tenant: string;
  bytes: number;
  /** The tenant's bound of stored results; 0: none. */
  bound: number;
}

/** The states an MCP server connection reports, one gauge series each. */
const MCP_STATES = ["idle", "waiting", "connecting", "ready", "stopped"] as const;

/** What an MCP server reports to {@link ToolmeshMetrics.observeMcpServers}. */
export interface McpServerReading {
  server: string;
  state: string;
  restarts: number;
}

/** What a tool's work queue holds, read from its JetStream consumer. */
export interface QueueReading {
  tool: string;
  /** Messages not yet delivered (consumer lag). */
  pending: number;
  /** Messages delivered and not yet acknowledged (running or waiting for a retry). */
  ackPending: number;
}

/**
 * The instruments toolmesh records, with one method per thing that happens. Labels are bounded:
 * a tool label is only ever a registered tool's name, outcomes are error codes, and session or
 * call ids never appear. With metrics off every method is a no-op of the API.
 */
export class ToolmeshMetrics {
  readonly #calls: Counter;
  readonly #attempts: Counter;
  readonly #retries: Counter;
  readonly #timeouts: Counter;
  readonly #duration: Histogram;
  readonly #queueWait: Histogram;
  readonly #inFlight: UpDownCounter;
  readonly #executors: UpDownCounter;
  readonly #resolver: Counter;
  readonly #deadLetters: Counter;
  readonly #expansions: Counter;
  readonly #sessions: Counter;
  readonly #mcpDuration: Histogram;
  readonly #queues = new Set<() => Promise<QueueReading[]>>();
  readonly #servers = new Set<() => McpServerReading[]>();
  readonly #tenantRefused: Counter;
  readonly #gatewayCalls: Counter;
  readonly #gatewayDuration: Histogram;
  readonly #policyDecisions: Counter;
  readonly #auditEvents: Counter;
  readonly #auditFailures: Counter;
  readonly #auditDropped: Counter;
  readonly #auditLag: Histogram;
  readonly #approvalDecisionTime: Histogram;
  #approvalsWaiting: () => number = () => 0;
  readonly #tenants = new Set<() => TenantReading[]>();
  readonly #stored = new Set<() => StoredReading[]>();

  // eslint-disable-next-line max-lines-per-function -- a declarative table: each instrument with its name, unit and description, one after another
  constructor(provider: MeterProvider) {
    const meter = provider.getMeter("toolmesh");
    const seconds = { unit: "s", advice: { explicitBucketBoundaries: DURATION_BUCKETS_S } };
    this.#calls = meter.createCounter(MetricName.ToolCalls, {
      unit: "{call}",
      description: "Calls ended by an executor, by tool and error.type (absent: success)",
      valueType: ValueType.INT,
    });
    this.#attempts = meter.createCounter(MetricName.ToolAttempts, {
      unit: "{attempt}",
      description: "Attempts run, by tool and error.type",
      valueType: ValueType.INT,
    });
    this.#retries = meter.createCounter(MetricName.ToolRetries, {
      unit: "{retry}",
      description: "Failed attempts scheduled for another attempt, by tool and error.type",
      valueType: ValueType.INT,
    });
    this.#timeouts = meter.createCounter(MetricName.ToolTimeouts, {
      unit: "{timeout}",
      description: "Attempts that ran out of time (timeout or deadline_exceeded), by tool",
      valueType: ValueType.INT,
    });
    this.#duration = meter.createHistogram(MetricName.ToolCallDuration, {
      ...seconds,
      description: "From acceptance by the resolver to the final message, by tool and error.type",
    });
    this.#queueWait = meter.createHistogram(MetricName.ToolQueueWait, {
      ...seconds,
      description: "From acceptance by the resolver to the start of the first attempt, by tool",
    });
    this.#inFlight = meter.createUpDownCounter(MetricName.ToolInFlight, {
      unit: "{call}",
      description: "Attempts running now, by tool",
      valueType: ValueType.INT,
    });
    this.#executors = meter.createUpDownCounter(MetricName.ToolExecutors, {
      unit: "{executor}",
      description: "Executor processes serving the tool (1 per process; sum over replicas)",
      valueType: ValueType.INT,
    });
    this.#resolver = meter.createCounter(MetricName.ResolverCalls, {
      unit: "{call}",
      description:
        "Calls taken by a resolver, by toolmesh.resolution (resolved, rejected) and error.type",
      valueType: ValueType.INT,
    });
    this.#deadLetters = meter.createCounter(MetricName.DeadLetters, {
      unit: "{message}",
      description: "Messages moved to the dead-letter stream, by the stream they came from",
      valueType: ValueType.INT,
    });
    this.#expansions = meter.createCounter(MetricName.SchemaExpansions, {
      unit: "{schema}",
      description: "Full schemas sent to sessions after a call with missing arguments, by tool",
      valueType: ValueType.INT,
    });
    this.#sessions = meter.createCounter(MetricName.SchemaSessions, {
      unit: "{session}",
      description: "Sessions that received their first schema expansion",
      valueType: ValueType.INT,
    });
    this.#mcpDuration = meter.createHistogram(MetricName.McpRequestDuration, {
      ...seconds,
      description: "MCP requests sent by the bridge, by server, mcp.method.name and error.type",
    });

    this.#gatewayCalls = meter.createCounter(MetricName.GatewayCalls, {
      unit: "{call}",
      description: "Tool calls through the gateway, by tenant, tool and outcome (ok or error code)",
      valueType: ValueType.INT,
    });
    this.#gatewayDuration = meter.createHistogram(MetricName.GatewayCallDuration, {
      ...seconds,
      description: "Duration of tool calls through the gateway, by tenant, tool and outcome",
    });
    this.#policyDecisions = meter.createCounter(MetricName.PolicyDecisions, {
      unit: "{decision}",
      description:
        "Policy decisions on calls, by toolmesh.policy.effect (allow, deny, approval: waits for a person)",
      valueType: ValueType.INT,
    });
    this.#auditEvents = meter.createCounter(MetricName.AuditEvents, {
      unit: "{event}",
      description: "Audit events written to tenants' audit streams, by toolmesh.audit.type",
      valueType: ValueType.INT,
    });
    this.#auditFailures = meter.createCounter(MetricName.AuditWriteFailures, {
      unit: "{attempt}",
      description:
        "Audit writes that failed and will be retried (lost races for the chain's tail not counted)",
      valueType: ValueType.INT,
    });
    this.#auditDropped = meter.createCounter(MetricName.AuditDropped, {
      unit: "{event}",
      description:
        "Audit events dropped because their tenant's writes failed and its queue was full",
      valueType: ValueType.INT,
    });
    this.#auditLag = meter.createHistogram(MetricName.AuditLag, {
      ...seconds,
      description: "Time from an audit event's occurrence to its write in the audit stream",
    });
    this.#approvalDecisionTime = meter.createHistogram(MetricName.ApprovalDecisionTime, {
      unit: "s",
      description:
        "Time from a call's approval request to its decision, by toolmesh.approval.effect (approve, deny, expire)",
    });
    meter
      .createObservableGauge(MetricName.ApprovalsWaiting, {
        unit: "{call}",
        description: "Calls waiting for approval, as this resolver last counted them",
        valueType: ValueType.INT,
      })
      .addCallback((result) => {
        try {
          result.observe(this.#approvalsWaiting());
        } catch {
          // Telemetry never throws into the app.
        }
      });
    this.#tenantRefused = meter.createCounter(MetricName.TenantRefused, {
      unit: "{call}",
      description:
        "Calls a quota or the session limit refused, by toolmesh.tenant (tenants with a quota), error.type (rate_limited, quota_exceeded, overloaded) and toolmesh.quota",
      valueType: ValueType.INT,
    });
    meter
      .createObservableGauge(MetricName.TenantInFlight, {
        unit: "{call}",
        description: "Calls of a tenant with a quota accepted and not ended, by toolmesh.tenant",
        valueType: ValueType.INT,
      })
      .addCallback((result) => {
        for (const reading of this.#readTenants())
          result.observe(reading.inFlight, { [ATTR_TOOLMESH_TENANT]: reading.tenant });
      });
    meter
      .createObservableGauge(MetricName.TenantQueued, {
        unit: "{call}",
        description:
          "Calls of a tenant with a quota waiting for their fair turn at a busy tool, by toolmesh.tenant",
        valueType: ValueType.INT,
      })
      .addCallback((result) => {
        for (const reading of this.#readTenants())
          result.observe(reading.queued, { [ATTR_TOOLMESH_TENANT]: reading.tenant });
      });
    meter
      .createObservableGauge(MetricName.TenantStored, {
        unit: "By",
        description:
          "Bytes of results a tenant's calls have stored within the call retention, by toolmesh.tenant; every resolver reports the same",
        valueType: ValueType.INT,
      })
      .addCallback((result) => {
        for (const reading of this.#readStored())
          result.observe(reading.bytes, { [ATTR_TOOLMESH_TENANT]: reading.tenant });
      });
    meter
      .createObservableGauge(MetricName.TenantStoredLimit, {
        unit: "By",
        description:
          "A tenant's bound of stored results, past which its calls are refused quota_exceeded storage, by toolmesh.tenant (tenants with a bound)",
        valueType: ValueType.INT,
      })
      .addCallback((result) => {
        for (const reading of this.#readStored())
          if (reading.bound > 0)
            result.observe(reading.bound, { [ATTR_TOOLMESH_TENANT]: reading.tenant });
      });
    meter
      .createObservableGauge(MetricName.QueuePending, {
        unit: "{message}",
        description: "Calls waiting in the work stream for an executor (consumer lag), by tool",
        valueType: ValueType.INT,
      })
      .addCallback(async (result) => {
        for (const reading of await this.#readQueues())
          result.observe(reading.pending, { [ATTR_GEN_AI_TOOL_NAME]: reading.tool });
      });
    meter
      .createObservableGauge(MetricName.QueueAckPending, {
        unit: "{message}",
        description: "Calls delivered to executors and not yet acknowledged, by tool",
        valueType: ValueType.INT,
      })
      .addCallback(async (result) => {
        for (const reading of await this.#readQueues())
          result.observe(reading.ackPending, { [ATTR_GEN_AI_TOOL_NAME]: reading.tool });
      });
    meter
      .createObservableGauge(MetricName.McpServerState, {
        unit: "1",
        description: "1 for the state each MCP server connection is in, 0 for the others",
        valueType: ValueType.INT,
      })
      .addCallback((result: ObservableResult) => {
        for (const reading of this.#readServers()) {
          for (const state of MCP_STATES) {
            result.observe(state === reading.state ? 1 : 0, {
              [ATTR_TOOLMESH_MCP_SERVER]: reading.server,
              [ATTR_TOOLMESH_MCP_STATE]: state,
            });
          }
        }
      });
    meter
      .createObservableCounter(MetricName.McpServerRestarts, {
        unit: "{restart}",
        description: "Times an MCP server connection was opened again after its first",
        valueType: ValueType.INT,
      })
      .addCallback((result: ObservableResult) => {
        for (const reading of this.#readServers())
          result.observe(reading.restarts, { [ATTR_TOOLMESH_MCP_SERVER]: reading.server });
      });
  }

  /** A process started (+1) or stopped (-1) serving `tool`. */
  toolServed(tool: string, delta: 1 | -1): void {
    this.#executors.add(delta, toolAttributes(tool));
  }

  /** An attempt starts; `queueWaitS` (seconds since acceptance) for a call's first attempt. */
  attemptStarted(tool: string, queueWaitS?: number): void {
    const attributes = toolAttributes(tool);
    this.#inFlight.add(1, attributes);
    if (queueWaitS !== undefined) this.#queueWait.record(Math.max(0, queueWaitS), attributes);
  }

  /** An attempt ended, with `code` when it failed; `retried` when another attempt follows. */
  attemptEnded(tool: string, code: string | undefined, retried: boolean): void {
    const attributes = toolAttributes(tool);
    this.#inFlight.add(-1, attributes);
    const outcome = outcomeAttributes(tool, code);
    this.#attempts.add(1, outcome);
    if (code === "timeout" || code === "deadline_exceeded") this.#timeouts.add(1, attributes);
    if (retried) this.#retries.add(1, outcome);
  }

  /** A call ended with its final message; `durationS` since its acceptance. */
  callEnded(tool: string, code: string | undefined, durationS: number): void {
    const outcome = outcomeAttributes(tool, code);
    this.#calls.add(1, outcome);
    this.#duration.record(Math.max(0, durationS), outcome);
  }

  /**
   * A resolver routed a call (no `code`) or answered it with an error. `tool` only when it is
   * registered: a name the model made up never becomes a label.
   */
  resolved(code: string | undefined, tool: string | undefined): void {
    this.#resolver.add(1, {
      [ATTR_TOOLMESH_RESOLUTION]: code === undefined ? "resolved" : "rejected",
      ...(code === undefined ? {} : { [ATTR_ERROR_TYPE]: code }),
      ...(tool === undefined ? {} : { [ATTR_GEN_AI_TOOL_NAME]: tool }),
    });
  }

  /** A message of `stream` was dead-lettered. */
  deadLettered(stream: string): void {
    this.#deadLetters.add(1, { "messaging.destination.name": stream });
  }

  /** A schema was sent to a session; `firstForSession` when it is the session's first. */
  schemaExpanded(tool: string, firstForSession: boolean): void {
    this.#expansions.add(1, toolAttributes(tool));
    if (firstForSession) this.#sessions.add(1);
  }

  /** An MCP request to `server` took `durationS`; `code` when it failed. */
  mcpRequest(server: string, method: string, durationS: number, code: string | undefined): void {
    this.#mcpDuration.record(durationS, {
      [ATTR_TOOLMESH_MCP_SERVER]: server,
      [ATTR_MCP_METHOD_NAME]: method,
      ...(code === undefined ? {} : { [ATTR_ERROR_TYPE]: code }),
    });
  }

  /** A tool call through the gateway ended with `outcome` (`ok` or an error code). */
  gatewayCallEnded(tenant: string, tool: string, outcome: string, durationS: number): void {
    const attributes = { [ATTR_TOOLMESH_TENANT]: tenant, "toolmesh.tool": tool, outcome };
    this.#gatewayCalls.add(1, attributes);
    this.#gatewayDuration.record(durationS, attributes);
  }

  /**
   * A limit refused a call of `tenant` (a token; undefined for a tenant not labelled) with
   * `code`, naming `quota`.
   */
  tenantRefused(tenant: string | undefined, code: string, quota: string): void {
    this.#tenantRefused.add(1, {
      ...(tenant === undefined ? {} : { [ATTR_TOOLMESH_TENANT]: tenant }),
      [ATTR_ERROR_TYPE]: code,
      [ATTR_TOOLMESH_QUOTA]: quota,
    });
  }

  /** An audit event of `type` was written, `lagMs` after it happened. */
  auditWritten(type: string, lagMs: number): void {
    this.#auditEvents.add(1, { "toolmesh.audit.type": type });
    this.#auditLag.record(lagMs / 1_000);
  }

  /** An audit write failed; the event stays queued and is written again. */
  auditWriteFailed(): void {
    this.#auditFailures.add(1);
  }

  /** An audit event was dropped: its tenant's writes fail and its queue is full. */
  auditDropped(): void {
    this.#auditDropped.add(1);
  }

  /** A policy decided a call: `allow`, `deny`, or `approval` (it waits for a person). */
  policyDecision(effect: "allow" | "deny" | "approval"): void {
    this.#policyDecisions.add(1, { "toolmesh.policy.effect": effect });
  }

  /** A waiting call was decided `seconds` after it asked for approval. */
  approvalDecided(effect: "approve" | "deny" | "expire", seconds: number): void {
    this.#approvalDecisionTime.record(seconds, { "toolmesh.approval.effect": effect });
  }

  /** Reports the calls waiting for approval at each collection. */
  observeApprovalsWaiting(read: () => number): void {
    this.#approvalsWaiting = read;
  }

  /** Reports tenants' use at each collection; returns the function that stops reporting. */
  observeTenants(read: () => TenantReading[]): () => void {
    this.#tenants.add(read);
    return () => this.#tenants.delete(read);
  }

  /** Reports tenants' stored results at each collection; returns the function that stops it. */
  observeStoredResults(read: () => StoredReading[]): () => void {
    this.#stored.add(read);
    return () => this.#stored.delete(read);
  }

  #readStored(): StoredReading[] {
    return [...this.#stored].flatMap((read) => {
      try {
        return read();
      } catch {
        return [];
      }
    });
  }

  #readTenants(): TenantReading[] {
    return [...this.#tenants].flatMap((read) => {
      try {
        return read();
      } catch {
        return [];
      }
    });
  }

  /** Reports work queues at each collection; returns the function that stops reporting. */
  observeQueues(read: () => Promise<QueueReading[]>): () => void {
    this.#queues.add(read);
    return () => this.#queues.delete(read);
  }

  /** Reports MCP servers at each collection; returns the function that stops reporting. */
  observeMcpServers(read: () => McpServerReading[]): () => void {
    this.#servers.add(read);
    return () => this.#servers.delete(read);
  }

  async #readQueues(): Promise<QueueReading[]> {
    const all = await Promise.all(
      [...this.#queues].map((read) => read().catch((): QueueReading[] => [])),
    );
    return all.flat();
  }

  #readServers(): McpServerReading[] {
    return [...this.#servers].flatMap((read) => {
      try {
        return read();
      } catch {
        return [];
      }
    });
  }
}

function toolAttributes(tool: string): Attributes {
  return { [ATTR_GEN_AI_TOOL_NAME]: tool };
}

function outcomeAttributes(tool: string, code: string | undefined): Attributes {
  return code === undefined
    ? { [ATTR_GEN_AI_TOOL_NAME]: tool }
    : { [ATTR_GEN_AI_TOOL_NAME]: tool, [ATTR_ERROR_TYPE]: code };
}

const INSTRUMENTS_KEY = Symbol.for("@toolmesh/telemetry.instruments");
const cache = globalThis as { [INSTRUMENTS_KEY]?: WeakMap<MeterProvider, ToolmeshMetrics> };

/**
 * The instruments on the global meter provider as it is now: call it when an actor starts,
 * after `initMetrics`. Created once per provider and shared by every actor of the process.
 */
export function toolmeshMetrics(): ToolmeshMetrics {
  const provider = metrics.getMeterProvider();
  const byProvider = (cache[INSTRUMENTS_KEY] ??= new WeakMap());
  let instruments = byProvider.get(provider);
  if (instruments === undefined) {
    instruments = new ToolmeshMetrics(provider);
    byProvider.set(provider, instruments);
  }
  return instruments;
}
