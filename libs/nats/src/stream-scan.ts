import type { JetStreamManager, MsgRequest, StoredMsg } from "@nats-io/jetstream";

/**
 * The first message of `stream` at or after sequence `from` on a subject matching `filter`, from
 * the stream's leader; null when there is none. nats-server 2.9 answers `next_by_subj` on
 * STREAM.MSG.GET, skipping the gaps that deleted or acknowledged messages leave; nats.js types it
 * only for direct gets, which not every stream enables.
 */
export function nextMessage(
  jsm: JetStreamManager,
  stream: string,
  from: number,
  filter: string,
): Promise<StoredMsg | null> {
  const query = { seq: from, next_by_subj: filter } as unknown as MsgRequest;
  return jsm.streams.getMessage(stream, query);
}

/** A key's current value in a bucket, as {@link scanBucket} reads it. */
export interface ScannedEntry {
  key: string;
  value: Uint8Array;
  /** Its revision: the stream sequence of the value. */
  revision: number;
  /** When the value was stored (the server's clock). */
  created: Date;
}

/**
 * The keys of `bucket` under `filter` (`>`: all) that hold a value, each with its value and
 * revision, read from the bucket's stream leader by message gets (`next_by_subj`, one per stored
 * message) instead of `kv.keys()`. Listing keys makes a consumer, and nats-server 2.9 fails to
 * make one about 40 % of the time while a node of the stream's cluster is down (for as long as it
 * stays down); message gets keep working once a leader is elected. A key's latest message
 * decides: one whose latest is a delete or purge marker is left out.
 */
export async function scanBucket(
  jsm: JetStreamManager,
  bucket: string,
  filter = ">",
): Promise<ScannedEntry[]> {
  const stream = `KV_${bucket}`;
  const prefix = `$KV.${bucket}.`;
  const latest = new Map<string, StoredMsg>();
  for (let from = 1; ;) {
    const msg = await nextMessage(jsm, stream, from, `${prefix}${filter}`);
    if (msg === null) break;
    latest.set(msg.subject.slice(prefix.length), msg);
    from = msg.seq + 1;
  }
  const entries: ScannedEntry[] = [];
  for (const [key, msg] of latest) {
    const operation = msg.header?.get("KV-Operation") ?? "";
    if (operation === "DEL" || operation === "PURGE") continue;
    entries.push({ key, value: msg.data, revision: msg.seq, created: msg.time });
  }
  return entries;
}
