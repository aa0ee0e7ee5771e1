import { JetStreamApiCodes, JetStreamApiError } from "@nats-io/jetstream";

/**
 * The JetStream API error codes toolmesh acts on (`JetStreamApiError.code`), named once: the
 * ones nats.js exports plus the ones it does not. The numbers are nats-server's
 * `server/errors.json` and do not change between server versions.
 */
export const JsApiCode = {
  ...JetStreamApiCodes,
  /** JetStream has no leader to answer right now ("JetStream system temporarily unavailable"). */
  ClusterNotAvailable: 10008,
  /** A publish's `Nats-Expected-Last-Msg-Id` is not the id of the stream's last message. */
  StreamWrongLastMsgId: 10070,
  /** A message is larger than the stream's `max_msg_size`. */
  StreamMessageExceedsMaximum: 10054,
  /** A stream of that name exists with another configuration (a concurrent create). */
  StreamNameExist: 10058,
  /**
   * Another stream takes some of the subjects; also nats-server 2.9's answer to a create of a
   * stream that another process is creating with other subjects.
   */
  StreamSubjectOverlap: 10065,
  /** The stream's store refused the write: its `max_bytes` or `max_msgs` with discard new. */
  StreamStoreFailed: 10077,
  /** The server or account has no file storage left. */
  StorageResourcesExceeded: 10047,
  /** The server or account has no memory storage left. */
  MemoryResourcesExceeded: 10028,
  /** A consumer's filter is not a subset of its stream's subjects (nats-server 2.9 also for a filter wider than one stored kind). */
  ConsumerFilterNotSubset: 10093,
} as const;

/** One of the codes in {@link JsApiCode}. */
export type JsApiCode = (typeof JsApiCode)[keyof typeof JsApiCode];

/** The codes with which a stream refuses a write because it or the server is full. */
export const STREAM_FULL_CODES: readonly number[] = [
  JsApiCode.StreamStoreFailed,
  JsApiCode.StorageResourcesExceeded,
  JsApiCode.MemoryResourcesExceeded,
];

/**
 * Whether a KV `create()` or `update()` (or a publish with an expected last subject sequence)
 * lost a compare-and-set: someone else wrote the key first. Both servers answer 10071; like
 * `@nats-io/kv`'s own `create()`, 10164 (the same refusal, newer servers) counts too.
 */
export function isWrongLastSequence(err: unknown): boolean {
  return (
    err instanceof JetStreamApiError &&
    (err.code === JsApiCode.StreamWrongLastSequence ||
      err.code === JsApiCode.StreamWrongLastSequenceUnknown)
  );
}
