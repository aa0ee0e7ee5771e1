import { hostname } from "node:os";
import type { NatsConnection, Subscription } from "@nats-io/nats-core";
import type { StatsReply, Subjects } from "@toolmesh/protocol";
import { encodeJson } from "@toolmesh/protocol";
import type { Logger, Metrics } from "@toolmesh/telemetry";

/**
 * Answers every request on the stats subject with this process's metrics. Every process
 * subscribes without a queue group, so one request gathers an answer from each replica
 * (`toolmesh stats` waits for the answers to stop coming).
 */
export function answerStats(options: {
  nc: NatsConnection;
  subjects: Subjects;
  metrics: Metrics;
  service: string;
  log: Logger;
}): Subscription {
  const { nc, subjects, metrics, service, log } = options;
  const instance = `${hostname()}:${process.pid}`;
  const startedAt = Date.now();
  return nc.subscribe(subjects.stats, {
    callback: (err, msg) => {
      if (err !== null) return;
      void metrics.snapshot().then((snapshot) => {
        const reply: StatsReply = { service, instance, started_at: startedAt, metrics: snapshot };
        try {
          msg.respond(encodeJson(reply));
        } catch (error) {
          log.warn({ err: error }, "cannot answer a stats request");
        }
      });
    },
  });
}
