import type { JetStreamManager } from "@nats-io/jetstream";
import type { ProvisionChange } from "./provision.js";
import { durableConsumerSpec, ensureConsumer } from "./provision.js";

/** A durable pull consumer as toolmesh configures them. Durations in ms. */
export interface DurableConsumerOptions {
  stream: string;
  name: string;
  /** Only messages on this subject; default every message of the stream. */
  filterSubject?: string;
  /** How long a delivered message stays owned without an ack or a heartbeat, in ms. */
  ackWaitMs: number;
  /** Deliveries before the server gives up (and sends its advisory); -1 for no limit. */
  maxDeliver: number;
  /** Messages delivered and not yet acknowledged, over all its clients. */
  maxAckPending: number;
}

/**
 * Creates a durable pull consumer (explicit acks, every message), or brings the settings that
 * may change (ack wait, max deliver, max ack pending) up to date; one that matches is left
 * alone. Safe from many replicas.
 */
export function ensureDurableConsumer(
  jsm: JetStreamManager,
  options: DurableConsumerOptions,
): Promise<ProvisionChange> {
  return ensureConsumer(jsm, durableConsumerSpec(options));
}
