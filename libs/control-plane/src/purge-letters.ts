import type { NatsConnection } from "@nats-io/nats-core";
import type { JetStreamManager } from "@nats-io/jetstream";
import { DeliverPolicy, jetstream, jetstreamManager } from "@nats-io/jetstream";
import type { Subjects } from "@toolmesh/protocol";
import { compareVersions } from "@toolmesh/nats";
import { streamError } from "./dead-letters.js";

/**
 * The first server seen to give an account's storage back after a purge with a subject filter:
 * 2.9.10 frees the stream's bytes and the disk but never lowers the account's use, so an account
 * with a JetStream storage limit stays "full" (ADR 0051). Older ones delete letter by letter.
 */
const FILTERED_PURGE_SERVER = "2.15.0";

/** Options of {@link purgeDeadLetters}. */
export interface PurgeDeadLettersOptions {
  /** Only the letters of this tool (its `{p}.v1.dlq.{tool}` subject). Default: every letter. */
  tool?: string;
}

/** What {@link purgeDeadLetters} removed, and what the dead-letter stream holds afterwards. */
export interface PurgeOutcome {
  /** Letters removed. */
  purged: number;
  /** Bytes the dead-letter stream held before and after, by the server's count. */
  bytes_before: number;
  bytes_after: number;
  /** Letters it holds after. */
  letters_after: number;
}

/**
 * Removes dead letters (of one tool's subject, or all of them) so that their space is given
 * back to the account as well as the disk: a purge of the whole stream, or of one subject on
 * servers from {@link FILTERED_PURGE_SERVER}; on older ones one tool's letters are deleted one
 * by one (ADR 0051). Says how many went and the stream's bytes before and after. Throws
 * `unavailable` when the stream does not exist.
 */
export async function purgeDeadLetters(
  nc: NatsConnection,
  subjects: Subjects,
  options: PurgeDeadLettersOptions = {},
): Promise<PurgeOutcome> {
  const stream = subjects.streams.dlq;
  try {
    const jsm = await jetstreamManager(nc);
    const before = (await jsm.streams.info(stream)).state;
    const filter = options.tool === undefined ? undefined : subjects.dlq(options.tool);
    const purged =
      filter === undefined
        ? (await jsm.streams.purge(stream)).purged
        : compareVersions(nc.info?.version ?? "0.0.0", FILTERED_PURGE_SERVER) >= 0
          ? (await jsm.streams.purge(stream, { filter })).purged
          : await deleteEach(nc, jsm, stream, filter);
    const after = (await jsm.streams.info(stream)).state;
    return {
      purged,
      bytes_before: before.bytes,
      bytes_after: after.bytes,
      letters_after: after.messages,
    };
  } catch (err) {
    throw streamError(err, stream);
  }
}

/** Deletes every message of `stream` on `filter`, one by one; returns how many. */
async function deleteEach(
  nc: NatsConnection,
  jsm: JetStreamManager,
  stream: string,
  filter: string,
): Promise<number> {
  const reader = await jetstream(nc).consumers.get(stream, {
    filter_subjects: filter,
    deliver_policy: DeliverPolicy.All,
  });
  let deleted = 0;
  try {
    let pending = (await reader.info()).num_pending;
    while (pending > 0) {
      const batch = await reader.fetch({ max_messages: Math.min(pending, 256), expires: 5_000 });
      let received = 0;
      for await (const msg of batch) {
        received++;
        if (await jsm.streams.deleteMessage(stream, msg.seq, false).catch(() => false)) deleted++;
        pending = msg.info.pending;
        if (pending === 0) break;
      }
      if (received === 0) break;
    }
  } finally {
    await reader.delete().catch(() => undefined);
  }
  return deleted;
}
