import type { MsgHdrs, NatsConnection } from "@nats-io/nats-core";
import {
  InvalidArgumentError,
  NoRespondersError,
  TimeoutError,
  headers as createHeaders,
} from "@nats-io/nats-core";
import type { JetStreamClient, PubAck } from "@nats-io/jetstream";
import { JetStreamApiError } from "@nats-io/jetstream";
import { ErrorCode, Header, ToolmeshError, encodeJson, payloadTooLarge } from "@toolmesh/protocol";
import { injectTraceHeaders } from "@toolmesh/telemetry";
import { JsApiCode, STREAM_FULL_CODES } from "./api-codes.js";
import { unavailableKind } from "./unavailable.js";

/** Options of {@link publishDurable}. */
export interface PublishOptions {
  /** JetStream deduplication id (`Nats-Msg-Id`). */
  msgId?: string;
  /** Extra headers; trace context is added to them. */
  headers?: MsgHdrs;
  /** How long to wait for the stream's acknowledgement, in ms. Default 5 000. */
  timeoutMs?: number;
}

/** How the server words a refusal by `discard_new_per_subject` (store full, per subject). */
const PER_SUBJECT_FULL = /per subject/;
/** How the server words a refusal by `max_msgs` with discard new (the stream is full). */
const MESSAGES_FULL = /^maximum messages exceeded/;
/** How the server words a refusal by `max_bytes` with discard new (the stream's bytes are used up). */
const BYTES_FULL = /^maximum bytes exceeded/;

/** Headers carrying the active trace context, plus any given. */
export function tracedHeaders(extra?: Record<string, string>): MsgHdrs {
  const h = createHeaders();
  injectTraceHeaders(h);
  if (extra !== undefined) for (const [k, v] of Object.entries(extra)) h.set(k, v);
  return h;
}

/**
 * The headers of a final message: the trace context and the tool it ends a call of, which the
 * readers of its republished headers take instead of its body (ADR 0066), and with an audit
 * trail the call's end recorded from it (`ended`, ADR 0068).
 */
export function finalHeaders(message: { name: string }, ended?: string): MsgHdrs {
  const h = tracedHeaders();
  // A name a header cannot carry (a refused call's may hold a newline) is left out.
  if (HEADER_SAFE.test(message.name)) h.set(Header.Tool, message.name);
  if (ended !== undefined) h.set(Header.Ended, ended);
  return h;
}

/** Printable ASCII, at most 256 characters: what a header value carries as it is. */
const HEADER_SAFE = /^[ -~]{1,256}$/;

/**
 * Maps a NATS publish failure to a typed error; `size` (the message's `bytes` and the
 * server's `limit`) goes into the details of a `payload_too_large`.
 */
export function publishError(
  err: unknown,
  subject: string,
  size: { bytes?: number; limit?: number } = {},
): ToolmeshError {
  if (err instanceof ToolmeshError) return err;
  if (err instanceof InvalidArgumentError && /max_payload/.test(err.message)) {
    return new ToolmeshError(
      ErrorCode.PayloadTooLarge,
      "message is larger than the server's max_payload",
      {
        details: { subject, ...size },
        cause: err,
      },
    );
  }
  if (err instanceof JetStreamApiError) {
    const refused = streamRefusal(err, subject);
    if (refused !== undefined) return refused;
  }
  if (err instanceof RangeError) {
    // JSON.stringify ran out of stack or string length. Callers bound what they send, so this
    // is a failure of ours; the engine's own words stay in the cause, off the wire.
    return new ToolmeshError(
      ErrorCode.Internal,
      "message cannot be encoded as JSON: it nests too deeply or is too large",
      { retryable: false, details: { subject }, cause: err },
    );
  }
  if (err instanceof NoRespondersError || unavailableKind(err) === "no responders") {
    // nats.js says "jetstream is not enabled"; JetStream answers other subjects all the while.
    return new ToolmeshError(
      ErrorCode.Unavailable,
      `no stream took the message on ${subject}: none stores that subject (check the subject prefix and the tenant; toolmesh setup makes the streams), or its leader is being elected`,
      { details: { subject }, cause: err },
    );
  }
  if (err instanceof TimeoutError) {
    return new ToolmeshError(
      ErrorCode.Unavailable,
      `JetStream did not accept the message on ${subject}`,
      {
        cause: err,
      },
    );
  }
  return new ToolmeshError(
    ErrorCode.Unavailable,
    err instanceof Error ? err.message : String(err),
    {
      cause: err,
    },
  );
}

/** A stream's refusal of a message as a typed error: too large, or a bound reached. */
function streamRefusal(err: JetStreamApiError, subject: string): ToolmeshError | undefined {
  if (err.code === JsApiCode.StreamMessageExceedsMaximum) {
    return new ToolmeshError(
      ErrorCode.PayloadTooLarge,
      "message is larger than the stream's max_msg_size",
      {
        details: { subject },
        cause: err,
      },
    );
  }
  if (err.code === JsApiCode.StreamStoreFailed && PER_SUBJECT_FULL.test(err.message)) {
    // The calls stream keeps at most TOOLMESH_MAX_QUEUED_CALLS_PER_SESSION per session subject.
    return new ToolmeshError(
      ErrorCode.Overloaded,
      "too many calls of this session are waiting to be resolved: wait for answers, then submit again",
      { details: { subject, limit: "queued_per_session", retry_after_ms: 1000 }, cause: err },
    );
  }
  if (err.code === JsApiCode.StreamStoreFailed && MESSAGES_FULL.test(err.message)) {
    // A calls stream at its `max_msgs`: a tenant's own (TOOLMESH_MAX_QUEUED_CALLS_PER_TENANT,
    // ADR 0048) or the mesh's (TOOLMESH_MAX_QUEUED_CALLS); a publisher cannot tell which.
    return new ToolmeshError(
      ErrorCode.Overloaded,
      "too many calls are waiting to be resolved (of this tenant, or in the whole mesh): wait for answers, then submit again",
      { details: { subject, limit: "queued", retry_after_ms: 1000 }, cause: err },
    );
  }
  if (err.code === JsApiCode.StreamStoreFailed && BYTES_FULL.test(err.message)) {
    // A stream at its `max_bytes`: a tenant's calls stream (TOOLMESH_TENANT_STORE_BYTES), an
    // owner's work stream, or the mesh's share of TOOLMESH_STORE_BYTES (ADR 0050).
    return new ToolmeshError(
      ErrorCode.Overloaded,
      "the stream holding this message has used up its bytes: wait for answers, then submit again",
      { details: { subject, limit: "stored_bytes", retry_after_ms: 1000 }, cause: err },
    );
  }
  if (STREAM_FULL_CODES.includes(err.code)) {
    return new ToolmeshError(ErrorCode.Overloaded, `stream refused the message: ${err.message}`, {
      details: { subject, retry_after_ms: 1000 },
      cause: err,
    });
  }
  return undefined;
}

/**
 * Publishes JSON to a stream and waits for the ack; failures become typed errors. `value` is
 * encoded, unless it is bytes (JSON encoded already).
 */
export async function publishDurable(
  js: JetStreamClient,
  subject: string,
  value: unknown,
  options: PublishOptions = {},
): Promise<PubAck> {
  const headers = options.headers ?? tracedHeaders();
  const data = value instanceof Uint8Array ? value : encodeJson(value);
  try {
    return await js.publish(subject, data, {
      headers,
      ...(options.msgId === undefined ? {} : { msgID: options.msgId }),
      ...(options.timeoutMs === undefined ? {} : { timeout: options.timeoutMs }),
    });
  } catch (err) {
    const limit = (js as { nc?: NatsConnection }).nc?.info?.max_payload;
    throw publishError(err, subject, {
      bytes: data.length,
      ...(limit === undefined ? {} : { limit }),
    });
  }
}

/**
 * Publishes JSON on core NATS (no ack); for ephemeral events such as progress. A message
 * larger than the server's `max_payload` is refused with `payload_too_large` (`details.bytes`,
 * `details.limit`) before it is sent.
 */
export function publishEphemeral(
  nc: NatsConnection,
  subject: string,
  value: unknown,
  headers?: MsgHdrs,
): void {
  const data = encodeJson(value);
  const limit = nc.info?.max_payload;
  if (limit !== undefined && data.length > limit) {
    throw payloadTooLarge(
      `the message to ${subject} is ${data.length} bytes; the server carries at most ${limit}`,
      { field: "message", bytes: data.length, limit, subject },
    );
  }
  try {
    nc.publish(subject, data, { headers: headers ?? tracedHeaders() });
  } catch (err) {
    throw publishError(err, subject, { bytes: data.length });
  }
}

/** Where a dead letter came from and why it was given up. */
export interface DeadLetterOrigin {
  stream: string;
  subject: string;
  seq: number;
  reason: string;
  deliveries: number;
  /** The original message's headers: its message id and trace context are kept. */
  headers?: MsgHdrs | undefined;
}

/** Headers of a dead letter: its origin, the original message id and trace context. */
export function deadLetterHeaders(origin: DeadLetterOrigin): MsgHdrs {
  const h = createHeaders();
  h.set(Header.DlqStream, origin.stream);
  h.set(Header.DlqSubject, origin.subject);
  h.set(Header.DlqSequence, String(origin.seq));
  h.set(Header.DlqReason, origin.reason);
  h.set(Header.DlqDeliveries, String(origin.deliveries));
  const msgId = origin.headers?.get(Header.MsgId);
  if (msgId) h.set(Header.DlqMsgId, msgId);
  for (const key of [Header.TraceParent, Header.TraceState]) {
    const value = origin.headers?.get(key);
    if (value) h.set(key, value);
  }
  return h;
}
