import type { JetStreamManager } from "@nats-io/jetstream";
import type { DurableConsumerOptions, ProvisionChange } from "./provision.js";
import { durableConsumerSpec, ensureConsumer } from "./provision.js";

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

/**
 * How long a delivery handed back after a failure that may pass (a stream without a leader, a
 * store not yet available) waits for its next delivery: 1 s after the first, doubling with each
 * delivery, at most 10 s. Deliveries are counted against the consumer's `max_deliver`: waiting
 * longer each time rides out a leader election of several seconds instead of spending them all.
 */
export function handBackDelayMs(deliveryCount: number): number {
  return Math.min(1_000 * 2 ** Math.max(0, deliveryCount - 1), 10_000);
}
