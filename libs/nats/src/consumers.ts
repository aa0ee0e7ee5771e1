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
