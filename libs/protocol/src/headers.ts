/** NATS header names toolmesh reads and writes. */
export const Header = {
  /** JetStream deduplication id. */
  MsgId: "Nats-Msg-Id",
  /** W3C trace context. */
  TraceParent: "traceparent",
  /** W3C trace state. */
  TraceState: "tracestate",
  /** Delivery attempt of a call, counting from 1. */
  Attempt: "Toolmesh-Attempt",
} as const;
