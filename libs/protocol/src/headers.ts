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
  /** On a dead letter: the stream it came from. */
  DlqStream: "Toolmesh-Dlq-Stream",
  /** On a dead letter: its subject in that stream. */
  DlqSubject: "Toolmesh-Dlq-Subject",
  /** On a dead letter: its sequence in that stream. */
  DlqSequence: "Toolmesh-Dlq-Sequence",
  /** On a dead letter: why it was given up. */
  DlqReason: "Toolmesh-Dlq-Reason",
  /** On a dead letter: the original message's `Nats-Msg-Id`. */
  DlqMsgId: "Toolmesh-Dlq-Msg-Id",
  /** On a dead letter: how many times it was delivered. */
  DlqDeliveries: "Toolmesh-Dlq-Deliveries",
  /** On a work message: revision of the call record the resolver created or read for it. */
  RecordRevision: "Toolmesh-Record-Revision",
  /** On a work message: the call record's `args_hash`, to rebuild the record without reading it. */
  ArgsHash: "Toolmesh-Args-Hash",
  /** On work: the call's deadline, epoch ms on the server's clock (read by the deadline keeper). */
  Deadline: "Toolmesh-Deadline",
  /**
   * On work: the call's key (`callKey`); its final message carries `Nats-Msg-Id`
   * `result:{call key}`, which tells the deadline keeper the call ended.
   */
  CallKey: "Toolmesh-Call-Key",
  /**
   * On work queued once more after its deliveries ran out faster than its ack wait allows: how
   * many deliveries the earlier message had (ADR 0030).
   */
  Requeued: "Toolmesh-Requeued",
  /**
   * On a final message: the tool it ends a call of, for readers of its republished headers
   * (ADR 0066), which have no body to read the name from.
   */
  Tool: "Toolmesh-Tool",
  /**
   * On a final message, when the mesh keeps an audit trail: the call's end the resolvers record
   * from it (JSON: the publishing process in `by`, the event's type, ids and data), so they read
   * no body (ADR 0068).
   */
  Ended: "Toolmesh-Ended",
  /** On a message a stream republished: the subject it was stored under. */
  RepublishedSubject: "Nats-Subject",
  /** On a message a stream republished: its sequence in that stream. */
  RepublishedSequence: "Nats-Sequence",
  /** On headers a stream republished without the body: the body's size in bytes. */
  RepublishedSize: "Nats-Msg-Size",
} as const;
