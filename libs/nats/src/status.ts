import type { NatsConnection, QueuedIterator, Status } from "@nats-io/nats-core";

/** What to do on each kind of status change of a connection. */
export type StatusHandlers = {
  [K in Status["type"]]?: (status: Extract<Status, { type: K }>) => void | Promise<void>;
};

/**
 * Hands each status change of `nc` (a drop, a return, a lame-duck notice…) to its handler, one
 * at a time, until the connection closes or the returned function is called: what a part that
 * stops before its connection closes calls, so that its handlers no longer run and the client
 * lets go of its listener.
 */
export function followStatus(nc: NatsConnection, handlers: StatusHandlers): () => void {
  // nats.js hands back a queued iterator, whose `stop` removes the listener.
  const statuses = nc.status() as QueuedIterator<Status>;
  void (async () => {
    for await (const status of statuses) {
      const handle = handlers[status.type] as ((s: Status) => void | Promise<void>) | undefined;
      await handle?.(status);
    }
  })();
  return () => statuses.stop();
}
