import type { JetStreamClient, JetStreamManager } from "@nats-io/jetstream";
import { DeliverPolicy } from "@nats-io/jetstream";
import type { Subjects } from "@toolmesh/protocol";
import { Header, ResolvedCallSchema, decodeJsonOrUndefined } from "@toolmesh/protocol";
import type { CallStore } from "@toolmesh/call-store";
import type { Logger } from "@toolmesh/telemetry";

/** Options of {@link reconcileOrphans}. */
export interface ReconcileOptions {
  js: JetStreamClient;
  jsm: JetStreamManager;
  subjects: Subjects;
  store: CallStore;
  log: Logger;
  /** Most messages looked at per stream and pass. Default 10 000. */
  maxScan?: number;
}

/**
 * Puts orphaned work-queue messages back in line. After a server is killed, a few messages
 * its consumers had already acknowledged can reappear in the stream below the consumer's ack
 * floor, where they are never delivered again. Each is deleted and — unless its call already
 * ended — published again under a new message id. Only the resolver whose delete succeeds
 * publishes, so replicas reconciling at once do not double it. Returns how many were found.
 */
export async function reconcileOrphans(options: ReconcileOptions): Promise<number> {
  const { jsm, subjects } = options;
  let found = 0;
  for (const stream of [subjects.streams.calls, subjects.streams.work]) {
    const floors = new Map<string | undefined, number>();
    for (const info of await jsm.consumers.list(stream).next()) {
      floors.set(info.config.filter_subject || undefined, info.ack_floor.stream_seq);
    }
    const highest = Math.max(0, ...floors.values());
    const state = (await jsm.streams.info(stream)).state;
    if (state.messages === 0 || state.first_seq > highest) continue;
    found += await scan(options, stream, state.first_seq, highest, floors);
  }
  return found;
}

async function scan(
  options: ReconcileOptions,
  stream: string,
  from: number,
  to: number,
  floors: Map<string | undefined, number>,
): Promise<number> {
  const { js, jsm, subjects, store, log } = options;
  const reader = await js.consumers.get(stream, {
    deliver_policy: DeliverPolicy.StartSequence,
    opt_start_seq: from,
  });
  let found = 0;
  try {
    for (let scanned = 0; scanned < (options.maxScan ?? 10_000); scanned++) {
      const msg = await reader.next({ expires: 1_000 });
      if (msg === null || msg.seq > to) break;
      const floor = floors.get(msg.subject) ?? floors.get(undefined) ?? 0;
      if (msg.seq > floor) continue; // not acknowledged yet: pending work, not an orphan
      found++;
      let finished = false;
      if (stream === subjects.streams.work) {
        const call = ResolvedCallSchema.safeParse(decodeJsonOrUndefined(msg.data));
        finished = call.success && (await store.get(call.data))?.record.state === "done";
      }
      const deleted = await jsm.streams.deleteMessage(stream, msg.seq).catch(() => false);
      if (!deleted || finished) continue;
      const msgId = msg.headers?.get(Header.MsgId) ?? "";
      await js.publish(msg.subject, msg.data, {
        ...(msg.headers === undefined ? {} : { headers: msg.headers }),
        msgID: `${msgId}#orphan-${msg.seq}`,
      });
      log.warn({ stream, seq: msg.seq, subject: msg.subject }, "orphaned message put back in line");
    }
  } finally {
    await reader.delete().catch(() => undefined);
  }
  return found;
}
