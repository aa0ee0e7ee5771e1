// Baseline B: a BullMQ worker in its own process that returns each job's data (a no-op).
import { Worker } from "bullmq";

const [host, port] = (process.env.REDIS_ADDR ?? "127.0.0.1:6379").split(":");
const worker = new Worker(process.env.BENCH_QUEUE, async (job) => job.data.text, {
  connection: { host, port: Number(port), maxRetriesPerRequest: null },
  concurrency: Number(process.env.BENCH_CONCURRENCY ?? 64),
});
await worker.waitUntilReady();
process.stdout.write("ready\n");
process.on("SIGTERM", () => void worker.close().then(() => process.exit(0)));
