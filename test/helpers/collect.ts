import type { Msg, NatsConnection } from "@nats-io/nats-core";

/** Everything a connection receives on `subject` from now on, collected as it comes. */
export function collect(nc: NatsConnection, subject: string): Msg[] {
  const got: Msg[] = [];
  nc.subscribe(subject, {
    callback: (err, msg) => {
      if (err === null) got.push(msg);
    },
  });
  return got;
}
