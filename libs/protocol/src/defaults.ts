/**
 * Every default the services and libraries share, in one place; the environment variables of
 * the README's configuration table override them. Durations in ms, sizes in bytes.
 */
export const Defaults = {
  /** Budget of a call that sets no `timeout_ms` (`TOOLMESH_DEFAULT_TIMEOUT_MS`): 60 s. */
  callTimeoutMs: 60_000,
  /** How long a delivered message stays owned without a sign of life (`TOOLMESH_ACK_WAIT_MS`): 10 s. */
  ackWaitMs: 10_000,
  /** How long running work may finish once a service stops (`TOOLMESH_SHUTDOWN_GRACE_MS`): 10 s. */
  shutdownGraceMs: 10_000,
  /** How long call records are kept, the idempotency horizon (`TOOLMESH_CALL_RETENTION_MS`): 24 h. */
  callRetentionMs: 86_400_000,
  /** How long a session's schema-expansion state is kept (`TOOLMESH_SESSION_STATE_TTL_MS`): 24 h. */
  sessionStateTtlMs: 86_400_000,
  /** Largest message the streams accept (`TOOLMESH_MAX_MESSAGE_BYTES`): 1 MiB. */
  maxMessageBytes: 1024 * 1024,
  /** How long missing-arguments events are kept: 24 h. */
  eventRetentionMs: 86_400_000,
  /** How long dead letters are kept: 7 days. */
  deadLetterRetentionMs: 7 * 86_400_000,
  /**
   * How long a stopping service still waits, after the grace time, for handlers that ignore
   * their abort signal before it abandons them and exits 1 (`TOOLMESH_SHUTDOWN_FORCE_MS`): 5 s.
   */
  shutdownForceMs: 5_000,
  /**
   * How long one pull request of a work loop lives: 30 s. An idle consumer sends one pull per
   * this long; a lost pull is noticed by missed heartbeats (`pullHeartbeatMs`), not by expiry.
   */
  pullExpiresMs: 30_000,
  /** How often the server tells a waiting pull it is alive: 2.5 s; two missed mean it is lost. */
  pullHeartbeatMs: 2_500,
} as const;
