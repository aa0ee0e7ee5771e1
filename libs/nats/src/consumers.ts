import type { ConsumerConfig, JetStreamManager } from "@nats-io/jetstream";
import { AckPolicy, DeliverPolicy, JetStreamApiCodes, JetStreamApiError } from "@nats-io/jetstream";
import { nanos } from "@nats-io/nats-core";

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
 * may change (ack wait, max deliver, max ack pending) up to date. Safe from many replicas.
 */
export async function ensureDurableConsumer(
  jsm: JetStreamManager,
  options: DurableConsumerOptions,
): Promise<void> {
  const updatable = {
    ack_wait: nanos(options.ackWaitMs),
    max_deliver: options.maxDeliver,
    max_ack_pending: options.maxAckPending,
  };
  const exists = await jsm.consumers.info(options.stream, options.name).then(
    () => true,
    (err: unknown) => {
      if (err instanceof JetStreamApiError && err.code === JetStreamApiCodes.ConsumerNotFound)
        return false;
      throw err;
    },
  );
  if (exists) {
    await jsm.consumers.update(options.stream, options.name, updatable);
    return;
  }
  const config: Partial<ConsumerConfig> = {
    durable_name: options.name,
    ack_policy: AckPolicy.Explicit,
    deliver_policy: DeliverPolicy.All,
    ...(options.filterSubject === undefined ? {} : { filter_subject: options.filterSubject }),
    ...updatable,
  };
  try {
    await jsm.consumers.add(options.stream, config);
  } catch (err) {
    // Another replica created it meanwhile, with the same settings.
    if (!(err instanceof JetStreamApiError)) throw err;
    await jsm.consumers.update(options.stream, options.name, updatable);
  }
}
