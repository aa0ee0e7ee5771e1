import type { MsgHdrs, NatsConnection } from "@nats-io/nats-core";
import type { KV } from "@nats-io/kv";
import { Kvm } from "@nats-io/kv";
import { jetstreamManager } from "@nats-io/jetstream";
import type { EnsureOptions, StreamCompression } from "@toolmesh/nats";
import { isWrongLastSequence, meshPlan, nextMessage, openBucket, scanBucket } from "@toolmesh/nats";
import type {
  CallRecord,
  ResolvedCall,
  SessionAddress,
  Subjects,
  ToolMessage,
} from "@toolmesh/protocol";
import {
  Defaults,
  CallRecordSchema,
  ErrorCode,
  Header,
  ToolmeshError,
  callKey,
  decodeJson,
  encodeJson,
  encodeWithMemberAdded,
  encodeJsonWithMember,
} from "@toolmesh/protocol";

export { CallRecordSchema, CallStateSchema } from "@toolmesh/protocol";
export type { CallRecord } from "@toolmesh/protocol";

/**
 * Names one call: its idempotency key within its session. Records are keyed by
 * `callKey(address, idempotency_key)`, so a key names a call of one session only: another
 * session or tenant using the same key names another call.
 */
export interface CallRef {
  readonly idempotency_key: string;
  readonly address: SessionAddress;
}

/** What {@link CallStore.accept} found. */
export type AcceptOutcome =
  | { status: "new"; revision: number }
  | { status: "in_flight"; record: CallRecord; revision: number }
  | { status: "done"; record: CallRecord & { result: ToolMessage } }
  | { status: "conflict"; record: CallRecord };

/** Options of {@link CallStore.open}. Durations in ms. */
export interface CallStoreOptions {
  subjects: Subjects;
  /** How long records are kept: the idempotency horizon, in ms. Default 24 h. */
  retentionMs?: number;
  /** Replicas of the bucket when created or updated. Default 1. */
  replicas?: number;
  /** Compression of the bucket (ADR 0044); left out, an existing bucket keeps its own. */
  compression?: StreamCompression;
  /** What to do with an existing bucket whose settings differ. Default `"update"`. */
  existing?: EnsureOptions["existing"];
  /** `TOOLMESH_STORE_BYTES`, of which the bucket may hold its share (ADR 0050). Default 8 GiB. */
  storeBytes?: number;
}

/** Key of the calls bucket written to read the server's clock; call keys have three tokens. */
export const CLOCK_PROBE_KEY = "_clock";

/** `args_hash` of a record made by a cancellation that came before its call. */
export const ANY_ARGUMENTS = "*";

/**
 * The final message as it goes out: stamped with the `args_hash` of the call it ends, so a
 * frontend whose submission reused the call id with other arguments can tell it is not its own.
 * A record made by an early cancellation has no arguments to name.
 */
export function stampArguments(result: ToolMessage, record: CallRecord): ToolMessage {
  if (record.args_hash === ANY_ARGUMENTS || result.args_hash !== undefined) return result;
  return { ...result, args_hash: record.args_hash };
}

/**
 * The record of a call being accepted. The resolver creates it with this function and the
 * executor rebuilds it with the same one from the work message (ADR 0027), so the record an
 * executor writes back by compare-and-set is the one that was stored.
 */
export function callRecordOf(call: ResolvedCall, argsHash: string): CallRecord {
  return {
    idempotency_key: call.idempotency_key,
    call_id: call.call_id,
    session_id: call.session_id,
    address: { tenant: call.address.tenant, session: call.address.session },
    tool: call.tool,
    args_hash: argsHash,
    state: "accepted",
    deadline_at: call.deadline_at,
    ...(call.decision === undefined ? {} : { decision: call.decision }),
  };
}

function sameRecord(a: CallRecord, b: CallRecord): boolean {
  return (
    a.idempotency_key === b.idempotency_key &&
    a.call_id === b.call_id &&
    a.session_id === b.session_id &&
    a.address.tenant === b.address.tenant &&
    a.address.session === b.address.session &&
    a.tool === b.tool &&
    a.args_hash === b.args_hash &&
    a.state === b.state &&
    a.deadline_at === b.deadline_at &&
    JSON.stringify(a.decision) === JSON.stringify(b.decision) &&
    a.result === undefined &&
    b.result === undefined
  );
}

/**
 * Headers of a call's work message that let its executor end the call without reading the
 * record first: the revision `accept` created or found and the arguments hash. None when the
 * stored record is not `record` (an earlier submission's, say): the executor then reads it.
 */
export function knownRecordHeaders(
  record: CallRecord,
  accepted: AcceptOutcome,
): Record<string, string> | undefined {
  if (accepted.status === "in_flight" && !sameRecord(accepted.record, record)) return undefined;
  if (accepted.status !== "new" && accepted.status !== "in_flight") return undefined;
  return {
    [Header.RecordRevision]: String(accepted.revision),
    [Header.ArgsHash]: record.args_hash,
  };
}

/**
 * The record and revision a work message's headers stand for (see {@link knownRecordHeaders}),
 * or undefined when they are absent (an older resolver) or malformed.
 */
export function knownRecordOf(
  call: ResolvedCall,
  headers: MsgHdrs | undefined,
): { record: CallRecord; revision: number } | undefined {
  const revisionText = headers?.get(Header.RecordRevision) ?? "";
  const argsHash = headers?.get(Header.ArgsHash) ?? "";
  if (!/^[1-9][0-9]{0,14}$/.test(revisionText) || !/^[0-9a-f]{64}$/.test(argsHash))
    return undefined;
  return { record: callRecordOf(call, argsHash), revision: Number(revisionText) };
}

/** Most records {@link CallStore.remember} keeps; past it the oldest are forgotten. */
const REMEMBERED_RECORDS = 10_000;

/** Call records in a KV bucket, changed only by compare-and-set. */
export class CallStore {
  readonly #kv: KV;
  // Records this process wrote, by call key, for ending their calls without reading them.
  readonly #remembered = new Map<string, { record: CallRecord; revision: number }>();

  // What a key listing reads by message gets when it cannot make its consumer.
  readonly #nc: NatsConnection;
  readonly #bucket: string;

  private constructor(nc: NatsConnection, kv: KV, bucket: string) {
    this.#nc = nc;
    this.#kv = kv;
    this.#bucket = bucket;
  }

  /** Opens (creating when needed) the calls bucket. */
  static async open(nc: NatsConnection, options: CallStoreOptions): Promise<CallStore> {
    // The first service to start creates the bucket; a later one with another retention
    // brings it up to date (the last one started wins).
    const spec = meshPlan(options.subjects, {
      replicas: options.replicas,
      ...(options.compression === undefined ? {} : { compression: options.compression }),
      callRetentionMs: options.retentionMs ?? Defaults.callRetentionMs,
      ...(options.storeBytes === undefined ? {} : { storeBytes: options.storeBytes }),
    }).buckets.calls;
    const kv = await openBucket(nc, await jetstreamManager(nc), spec, {
      existing: options.existing ?? "update",
    });
    return new CallStore(nc, kv, options.subjects.callsBucket);
  }

  /**
   * Binds to the calls bucket as it is, neither creating nor changing it: for a reader of the
   * records the services keep.
   */
  static async bind(nc: NatsConnection, subjects: Subjects): Promise<CallStore> {
    const bucket = subjects.callsBucket;
    return new CallStore(nc, await new Kvm(nc).open(bucket), bucket);
  }

  /**
   * A fresh reading of the NATS server's clock: writes the probe key {@link CLOCK_PROBE_KEY}
   * (one token, so never a call's key) and reads back the time the server stored it.
   * `localMs` is when the read returned, so `localMs - serverMs` is at least the clock offset.
   */
  async serverTime(): Promise<{ serverMs: number; localMs: number }> {
    await this.#kv.put(CLOCK_PROBE_KEY, new Uint8Array(0));
    const entry = await this.#kv.get(CLOCK_PROBE_KEY);
    const localMs = Date.now();
    if (entry === null) throw new Error("the clock probe was not found after writing it");
    return { serverMs: entry.created.getTime(), localMs };
  }

  /** Records a new call, or reports what an earlier call with the same key became. */
  async accept(record: CallRecord): Promise<AcceptOutcome> {
    const key = callKey(record.address, record.idempotency_key);
    for (;;) {
      try {
        const revision = await this.#kv.create(key, encodeJson(record));
        return { status: "new", revision };
      } catch (err) {
        if (!isWrongLastSequence(err)) throw err;
      }
      const existing = await this.get(record);
      if (existing === undefined) continue; // expired or deleted meanwhile: try again
      const found = existing.record;
      // A record cancelled before its call arrived (ANY_ARGUMENTS) matches whatever comes.
      const tombstone = found.args_hash === ANY_ARGUMENTS;
      if (!tombstone && (found.args_hash !== record.args_hash || found.tool !== record.tool))
        return { status: "conflict", record: found };
      if (found.state === "done" && found.result !== undefined) {
        return { status: "done", record: { ...found, result: found.result } };
      }
      return { status: "in_flight", record: found, revision: existing.revision };
    }
  }

  /**
   * Takes up a record accepted before ({@link accept}'s `in_flight` at `revision`) for another
   * delivery of its call to route: stored again as it is, under a new revision, so the delivery
   * that accepted it can no longer take it back ({@link withdraw}). Resolves with the new
   * revision; throws when the record changed meanwhile (taken back, or ended): the call is
   * accepted again on its next delivery.
   */
  async takeUp(call: CallRef, revision: number): Promise<number> {
    const key = callKey(call.address, call.idempotency_key);
    const entry = await this.#kv.get(key);
    if (entry === null || entry.operation !== "PUT" || entry.revision !== revision)
      throw new ToolmeshError(
        ErrorCode.Unavailable,
        "the call's record changed while another delivery of it was taken up; it is accepted again",
        { retryable: true },
      );
    return this.#kv.update(key, entry.value, revision);
  }

  /**
   * Takes back a record {@link accept} stored as new at `revision`, for a call that then did
   * not go on: its key is free again. Throws when the record changed since (taken up by
   * another delivery of the call: {@link takeUp}).
   */
  async withdraw(call: CallRef, revision: number): Promise<void> {
    await this.#kv.delete(callKey(call.address, call.idempotency_key), { previousSeq: revision });
  }

  /** The record of a call, with its revision. */
  get(call: CallRef): Promise<{ record: CallRecord; revision: number } | undefined> {
    return this.byKey(callKey(call.address, call.idempotency_key));
  }

  /** The record stored under a call key ({@link callKey}), with its revision. */
  async byKey(key: string): Promise<{ record: CallRecord; revision: number } | undefined> {
    const entry = await this.#kv.get(key);
    if (entry === null || entry.operation !== "PUT") return undefined;
    return { record: CallRecordSchema.parse(decodeJson(entry.value)), revision: entry.revision };
  }

  /**
   * The record of a call with when its first and its latest revision were stored (the server's
   * clock); undefined when there is none, or when what is stored is not a call record.
   */
  async dated(call: CallRef): Promise<DatedRecord | undefined> {
    const key = callKey(call.address, call.idempotency_key);
    const entry = await this.#kv.get(key);
    if (entry === null || entry.operation !== "PUT") return undefined;
    const record = CallRecordSchema.safeParse(decodeJson(entry.value));
    if (!record.success) return undefined;
    let createdAt = entry.created;
    if (entry.revision > 1) {
      const history = await this.#kv.history({ key });
      for await (const h of history) {
        createdAt = h.created;
        break;
      }
    }
    return { record: record.data, createdAt, updatedAt: entry.created };
  }

  /**
   * The calls a tenant has records of, as the session token and idempotency-key token of each
   * record's key, in the order the bucket lists them. `tenant` is the tenant's subject token.
   */
  async callsOf(tenant: string): Promise<{ session: string; key: string }[]> {
    const calls: { session: string; key: string }[] = [];
    for (const key of await this.#keys(`${tenant}.>`)) {
      const [, session, call] = key.split(".");
      if (session !== undefined && call !== undefined) calls.push({ session, key: call });
    }
    return calls;
  }

  /**
   * The keys under `filter`, listed by a consumer (one stream of keys, however many). When that
   * fails — nats-server 2.9 fails to make the consumer about 40 % of the time while a node of
   * the bucket's cluster is down — they are read by message gets instead ({@link scanBucket}: a
   * request per stored record, slower for a large bucket, but working once a leader is elected).
   * So are they when the listing is empty but one message get finds a record under `filter`: a
   * consumer made while a node is down can also report nothing pending, and list nothing.
   */
  async #keys(filter: string): Promise<string[]> {
    try {
      const keys: string[] = [];
      for await (const key of await this.#kv.keys(filter)) keys.push(key);
      if (keys.length > 0 || !(await this.#holdsAny(filter))) return keys;
    } catch {
      // Read by message gets, below.
    }
    const jsm = await jetstreamManager(this.#nc);
    return (await scanBucket(jsm, this.#bucket, filter)).map((entry) => entry.key);
  }

  /** Whether the bucket's stream holds any message under `filter`: one message get. */
  async #holdsAny(filter: string): Promise<boolean> {
    const jsm = await jetstreamManager(this.#nc);
    const stream = `KV_${this.#bucket}`;
    return (await nextMessage(jsm, stream, 1, `$KV.${this.#bucket}.${filter}`)) !== null;
  }

  /**
   * Keeps the record this process stored for `call` at `revision` (at most
   * {@link REMEMBERED_RECORDS}, the oldest forgotten first), until {@link recall} takes it. The
   * mesh's own write, unlike a record a tool owner sends: a compare-and-set at its revision
   * succeeds only while it is the stored record.
   */
  remember(call: CallRef, known: { record: CallRecord; revision: number }): void {
    const key = callKey(call.address, call.idempotency_key);
    this.#remembered.delete(key);
    this.#remembered.set(key, known);
    if (this.#remembered.size > REMEMBERED_RECORDS) {
      const oldest = this.#remembered.keys().next().value;
      if (oldest !== undefined) this.#remembered.delete(oldest);
    }
  }

  /** The record {@link remember} kept for `call`, left kept: undefined when none is kept here. */
  peek(call: CallRef): { record: CallRecord; revision: number } | undefined {
    return this.#remembered.get(callKey(call.address, call.idempotency_key));
  }

  /** Takes the record {@link remember} kept for `call`: undefined when none is kept here. */
  recall(call: CallRef): { record: CallRecord; revision: number } | undefined {
    const key = callKey(call.address, call.idempotency_key);
    const known = this.#remembered.get(key);
    this.#remembered.delete(key);
    return known;
  }

  /**
   * Moves a call to `done` with its final message. `won` says whether this caller's message
   * became the final one; otherwise `result` is the stored one. `known` (a record just read)
   * saves a read when it is still current. `verify` sees every record (undefined: none) before it
   * is changed and throws to refuse it, a record read again after a lost compare-and-set too.
   * `encodedResult`, when given, is `result` as `encodeJson` wrote it. Undefined when no record
   * exists.
   */
  async finish(
    call: CallRef,
    result: ToolMessage,
    known?: { record: CallRecord; revision: number },
    verify?: (record: CallRecord | undefined) => void,
    encodedResult?: Uint8Array,
  ): Promise<FinishOutcome | undefined> {
    const key = callKey(call.address, call.idempotency_key);
    let current = known;
    for (;;) {
      current ??= await this.get(call);
      verify?.(current?.record);
      if (current === undefined) return undefined;
      const { record, revision } = current;
      if (record.state === "done" && record.result !== undefined) {
        return { won: false, result: record.result };
      }
      const stamped = stampArguments(result, record);
      // Serialized and encoded once for the record and for its publication (from the bytes the
      // caller made of it, when given): results may be large.
      const encoded =
        encodedResult === undefined
          ? encodeJson(stamped)
          : stamped === result
            ? encodedResult
            : encodeWithMemberAdded(encodedResult, "args_hash", stamped.args_hash);
      const { result: _earlier, ...rest } = record;
      try {
        await this.#kv.update(
          key,
          encodeJsonWithMember({ ...rest, state: "done" }, "result", encoded),
          revision,
        );
        return { won: true, result: stamped, encoded };
      } catch (err) {
        if (!isWrongLastSequence(err)) throw err;
        current = undefined; // changed meanwhile: read it again
      }
    }
  }
}

/** A call record with when its first and its latest revision were stored. */
export interface DatedRecord {
  record: CallRecord;
  createdAt: Date;
  updatedAt: Date;
}

/** What {@link CallStore.finish} did. */
export interface FinishOutcome {
  /** Whether this caller's message became the final one. */
  won: boolean;
  /** The final message: this caller's when it won, the stored one otherwise. */
  result: ToolMessage;
  /** `result` as UTF-8 JSON, when this caller won: the bytes to publish. */
  encoded?: Uint8Array;
}
