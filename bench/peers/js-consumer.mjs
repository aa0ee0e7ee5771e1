// Baseline J: a JetStream pull consumer in its own process. Each message published to the work
// queue stream is pulled, acknowledged, and its body sent back on the reply subject named in its
// `reply-to` header — the least a durable queue with a result needs.
import { connect } from "@nats-io/transport-node";
import { jetstream } from "@nats-io/jetstream";

const nc = await connect({ servers: process.env.NATS_URL, noAsyncTraces: true });
const js = jetstream(nc);
const consumer = await js.consumers.get("BENCH_J", "worker");
const messages = await consumer.consume({ max_messages: 256 });
process.stdout.write("ready\n");
process.on("SIGTERM", () => void nc.close().then(() => process.exit(0)));
for await (const m of messages) {
  m.ack();
  const to = m.headers?.get("reply-to");
  if (to) nc.publish(to, m.data);
}
