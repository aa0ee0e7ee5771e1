// Baseline R: a plain NATS responder in its own process, echoing each request's body.
import { connect } from "@nats-io/transport-node";

const nc = await connect({ servers: process.env.NATS_URL, noAsyncTraces: true });
nc.subscribe("bench.echo", { callback: (_err, msg) => msg.respond(msg.data) });
await nc.flush();
process.stdout.write("ready\n");
process.on("SIGTERM", () => void nc.close().then(() => process.exit(0)));
