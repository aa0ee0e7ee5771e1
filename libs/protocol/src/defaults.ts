/**
 * Every default the services and libraries share, in one place; the environment variables of
 * the README's configuration table override them. Durations in ms, sizes in bytes.
 */
export const Defaults = {
  /** Budget of a call that sets no `timeout_ms` (`TOOLMESH_DEFAULT_TIMEOUT_MS`): 60 s. */
  callTimeoutMs: 60_000,
  /**
   * How long a delivered message stays owned without a sign of life (`TOOLMESH_ACK_WAIT_MS`): 2 s.
   * A delivery lost with a connection (a server restarting) is delivered again after it, so it
   * bounds the slowest call through a rolling restart; heartbeats every third of it keep running
   * and waiting calls owned (docs/adr/0042).
   */
  ackWaitMs: 2_000,
  /** How long running work may finish once a service stops (`TOOLMESH_SHUTDOWN_GRACE_MS`): 10 s. */
  shutdownGraceMs: 10_000,
  /** How long call records are kept, the idempotency horizon (`TOOLMESH_CALL_RETENTION_MS`): 24 h. */
  callRetentionMs: 86_400_000,
  /** How long a session's schema-expansion state is kept (`TOOLMESH_SESSION_STATE_TTL_MS`): 24 h. */
  sessionStateTtlMs: 86_400_000,
  /** Largest message the streams accept (`TOOLMESH_MAX_MESSAGE_BYTES`): 1 MiB. */
  maxMessageBytes: 1024 * 1024,
  /**
   * Largest tool result (`TOOLMESH_MAX_RESULT_BYTES`): 512 KiB, the final message's JSON. A
   * larger one ends its call with `payload_too_large`; it is also held under the streams'
   * `max_msg_size` less 4 KiB, the room the call record needs around it (ADR 0049).
   */
  maxResultBytes: 512 * 1024,
  /**
   * Largest request of a kind that carries no arguments, results or definitions (catalog,
   * describe, expand, groups, cancel; an owner's record and unregister): 64 KiB.
   */
  maxSmallRequestBytes: 64 * 1024,
  /** Largest `description` of a registered tool, UTF-8: 16 KiB (ADR 0049). */
  maxToolDescriptionBytes: 16 * 1024,
  /** Largest `parameters` schema (and output schema) of a registered tool, as JSON: 64 KiB. */
  maxToolSchemaBytes: 64 * 1024,
  /** Largest `annotations` of a registered tool, as JSON: 4 KiB. */
  maxToolAnnotationsBytes: 4 * 1024,
  /** Largest definition of a registered tool, as JSON: 128 KiB. */
  maxToolDefinitionBytes: 128 * 1024,
  /** Most tools one owner may register: 512. */
  maxToolsPerOwner: 512,
  /** Most bytes of definitions one owner may register, as JSON: 4 MiB. */
  maxOwnerRegistryBytes: 4 * 1024 * 1024,
  /**
   * The most of the server's `max_payload` one catalog page fills (ADR 0049): 3/4 of it, room
   * for the envelope, headers and a proxy in between.
   */
  catalogPageShare: 0.75,
  /** How long missing-arguments events are kept: 24 h. */
  eventRetentionMs: 86_400_000,
  /** How long dead letters are kept: 7 days. */
  deadLetterRetentionMs: 7 * 86_400_000,
  /** Window in which the streams drop a repeated message id (`TOOLMESH_DUPLICATE_WINDOW_MS`): 2 min. */
  duplicateWindowMs: 120_000,
  /**
   * Compression of every stream and KV bucket on nats-server 2.10+ (`TOOLMESH_STREAM_COMPRESSION`):
   * `s2`. Older servers store them as they are (docs/adr/0044).
   */
  streamCompression: "s2" as "s2" | "none",
  /**
   * Bytes the mesh's own streams may hold together (`TOOLMESH_STORE_BYTES`): 8 GiB, shared out
   * among them by fixed shares (`STORE_SHARES` in `@toolmesh/nats`), so no one stream can take the
   * whole JetStream store.
   */
  storeBytes: 8 * 1024 ** 3,
  /** How long each tenant's audit events are kept (`TOOLMESH_AUDIT_RETENTION`): 90 days, in ms. */
  auditRetentionMs: 90 * 86_400_000,
  /** Bytes each tenant's own calls stream may hold (`TOOLMESH_TENANT_STORE_BYTES`): 256 MiB. */
  tenantStoreBytes: 256 * 1024 ** 2,
  /**
   * Bytes of final messages one tenant's calls may have stored within the call retention
   * (`TOOLMESH_TENANT_MAX_STORED_BYTES`): 64 MiB; past it its calls are refused `quota_exceeded`
   * `storage` (ADR 0050).
   */
  tenantMaxStoredBytes: 64 * 1024 ** 2,
  /** Bytes each tool owner's work stream may hold (`TOOLMESH_OWNER_STORE_BYTES`): 256 MiB. */
  ownerStoreBytes: 256 * 1024 ** 2,
  /** Most dead letters kept in all (`TOOLMESH_MAX_DEAD_LETTERS`); past it the oldest go. */
  maxDeadLetters: 100_000,
  /** Most calls waiting in the calls or work stream (`TOOLMESH_MAX_QUEUED_CALLS`). */
  maxQueuedCalls: 1_000_000,
  /**
   * Most calls of one session waiting in the calls stream (`TOOLMESH_MAX_QUEUED_CALLS_PER_SESSION`);
   * the server refuses more at once, before they are stored.
   */
  maxQueuedCallsPerSession: 1_000,
  /**
   * Most calls of one tenant waiting in its own calls stream (`TOOLMESH_MAX_QUEUED_CALLS_PER_TENANT`,
   * ADR 0048): the server refuses more, over all its sessions, before they are stored.
   */
  maxQueuedCallsPerTenant: 10_000,
  /** Calls of one session in flight through one resolver (`TOOLMESH_SESSION_MAX_IN_FLIGHT`). */
  sessionMaxInFlight: 256,
  /** Calls an executor or schema expander handles at once (`TOOLMESH_CONCURRENCY`). */
  concurrency: 16,
  /** Calls a resolver resolves at once. */
  resolverConcurrency: 64,
  /** How long a service keeps trying to reach NATS at start-up (`TOOLMESH_STARTUP_TIMEOUT_MS`): 2 min. */
  startupTimeoutMs: 120_000,
  /**
   * How long a running service may stay disconnected from NATS before `/healthz` reports it dead
   * (`TOOLMESH_LIVENESS_DISCONNECTED_MS`), in ms: one that cannot reconnect (an expired
   * certificate, a revoked credential) is restarted by Kubernetes instead of idling forever.
   */
  livenessDisconnectedMs: 60_000,
  /** How long the sessions stream keeps final messages and events: 1 h. */
  sessionRetentionMs: 3_600_000,
  /** How long the client's request-reply exchanges (dry runs, cancellations) wait: 5 s. */
  requestTimeoutMs: 5_000,
  /** Extra wait past a call's deadline before the client answers it itself: 2 s. */
  deadlineGraceMs: 2_000,
  /**
   * Queue age under which an executor runs a call's first delivery without reading its record
   * first, trusting the revision the work message carries (ADR 0027): 2 s.
   */
  freshWorkWindowMs: 2_000,
  /** Most messages one look through a work-queue stream reads (reconciliation, deadline keeper). */
  streamScanLimit: 10_000,
  /**
   * How long a stopping service still waits, after the grace time, for handlers that ignore
   * their abort signal before it abandons them and exits 1 (`TOOLMESH_SHUTDOWN_FORCE_MS`): 5 s.
   */
  shutdownForceMs: 5_000,
  /**
   * How long one pull request of a work loop lives: 5 s. An idle consumer sends one pull per
   * this long. A pull lost with a consumer's leader is made again at once when the new leader is
   * announced, or after missed heartbeats (`pullHeartbeatMs`), not after this.
   */
  pullExpiresMs: 5_000,
  /** How often the server tells a waiting pull it is alive: 1 s; two missed mean it is lost. */
  pullHeartbeatMs: 1_000,
  /** How often the control plane looks for orphaned work-queue messages while calls flow: 30 s. */
  reconcileEveryMs: 30_000,
  /** First token of every subject, stream and bucket name (`TOOLMESH_PREFIX`). */
  prefix: "toolmesh",
  /** Tenant (frontend) id when none is configured (`TOOLMESH_TENANT`). */
  tenant: "default",
  /** Per-attempt timeout of a tool whose definition sets no `timeout_ms`: 30 s. */
  toolTimeoutMs: 30_000,
  /** Params the resolver skips unless a tool says otherwise (docs/protocol.md#what-the-resolver-checks-in-order). */
  systemParams: ["executor", "storage"],
  /** Folder of native tool files (`TOOLMESH_NATIVE_TOOLS_DIR`); a missing one is no tools. */
  nativeToolsDir: "tools/native",
  /** Folder of MCP server files (`TOOLMESH_MCP_DIR`); a missing one is no servers. */
  mcpDir: "tools/mcp",
  /** Dead letters one listing returns when it names no limit. */
  deadLetterListLimit: 100,
  /** Port of the MCP gateway's `/mcp` (`TOOLMESH_GATEWAY_PORT`). */
  gatewayPort: 8787,
  /** Largest request body the gateway reads (`TOOLMESH_GATEWAY_MAX_BODY_BYTES`): 1 MiB. */
  gatewayMaxBodyBytes: 1_048_576,
  /** Requests one credential may have in flight on one gateway (`TOOLMESH_GATEWAY_MAX_CONCURRENT`). */
  gatewayMaxConcurrent: 64,
  /** Requests per second one credential may make on one gateway (`TOOLMESH_GATEWAY_RATE_PER_S`). */
  gatewayRatePerS: 100,
  /** Requests one credential may make at once above the rate (`TOOLMESH_GATEWAY_RATE_BURST`). */
  gatewayRateBurst: 200,
} as const;
