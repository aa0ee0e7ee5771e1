import { createHash } from "node:crypto";
import type { MsgHdrs, NatsConnection } from "@nats-io/nats-core";
import type { JetStreamClient, JetStreamManager, StoredMsg } from "@nats-io/jetstream";
import {
  DeliverPolicy,
  JetStreamApiCodes,
  JetStreamApiError,
  jetstream,
  jetstreamManager,
} from "@nats-io/jetstream";
import type { CallRequest, ResolvedCall, Subjects } from "@toolmesh/protocol";
import {
  CallRequestSchema,
  Defaults,
  ErrorCode,
  Header,
  MAX_ID_LENGTH,
  ResolvedCallSchema,
  ToolmeshError,
  callKey,
  ensureError,
  decodeJsonOrUndefined,
  idempotencyKeyOf,
  replayMsgId,
} from "@toolmesh/protocol";
import { publishDurable } from "@toolmesh/nats";
import { deadlineHeaders } from "./deadline-keeper.js";
import type { AcceptOutcome } from "@toolmesh/call-store";
import { CallStore, argumentsHash } from "@toolmesh/call-store";
import type { LetterEvidence } from "./letter-evidence.js";
import { letterEvidence } from "./letter-evidence.js";

/** One message of the dead-letter stream `{P}_DLQ`, as operators see it. */
export interface DeadLetter {
  /** Sequence in the dead-letter stream: the letter's id for `show` and `replay`. */
  seq: number;
  /** Tool of the call it holds; the subject token (`_unknown` for foreign bytes) without a call. */
  tool: string;
  /** When it was dead-lettered (stored in the DLQ), ISO 8601 by the server's clock. */
  time: string;
  /** Why it was given up: `max_deliveries`, `not a resolved call`, `not a call subject`… */
  reason: string;
  /** How many times it had been delivered when it was given up; 0 when unknown. */
  deliveries: number;
  /** Stream it came from: the work stream or the calls stream. */
  stream: string;
  /** Subject it had in that stream: where a replay publishes it again. */
  subject: string;
  /** Sequence it had in that stream (it has been deleted there). */
  original_seq?: number;
  /** The call's id (`tool_call_id`), when the body holds a call. */
  call_id?: string;
  /** The call's session, when the body holds a call. */
  session_id?: string;
  /** The call's idempotency key, when the body holds a call. */
  idempotency_key?: string;
  /** The tenant (subject token) of the call it names, when the body holds a call. */
  tenant?: string;
  /**
   * Set when the letter names a call the mesh never routed to the work it came from (no record,
   * or a record of another call or tool): why. Such a letter is evidence of its writer only and
   * is never replayed (ADR 0051).
   */
  suspect?: string;
}

/** A dead letter with its body. */
export interface DeadLetterDetail extends DeadLetter {
  /** The body as JSON: a resolved call (work stream) or a call request (calls stream). */
  body?: unknown;
  /** The body as base64, only when it is not JSON. */
  body_base64?: string;
}

/** Options of {@link listDeadLetters}. */
export interface ListDeadLettersOptions {
  /** Only the letters of this tool (its `{p}.v1.dlq.{tool}` subject). Default: every tool. */
  tool?: string;
  /** Most letters returned, oldest first. Default 100. */
  limit?: number;
}

/** Options of {@link replayDeadLetter}. Durations in ms. */
export interface ReplayDeadLetterOptions {
  /** Retention of the calls bucket, used only if the bucket must be created. Default 24 h. */
  callRetentionMs?: number;
  /** Epoch ms the replay's new deadline counts from. Default `Date.now()` (this host's clock). */
  now?: number;
}

/** What {@link replayDeadLetter} did. */
export interface ReplayOutcome {
  /** The letter's sequence in the dead-letter stream. */
  seq: number;
  /**
   * `replayed`: published again now. `already_done`: an earlier replay of this letter had
   * already ended the call, so nothing was published (the letter is still deleted).
   */
  status: "replayed" | "already_done";
  /** Stream the body went back to. */
  stream: string;
  /** Subject it was published on: its original subject. */
  subject: string;
  /** Its `Nats-Msg-Id`: `{original}#replay-{seq}`, which is also the replay's idempotency key. */
  msg_id: string;
  /** Idempotency key the replayed call runs under (equals `msg_id`). */
  idempotency_key: string;
  /** The key the call had before. */
  original_idempotency_key: string;
  call_id: string;
  session_id: string;
  tool: string;
  /** Sequence of the republished message in `stream`; absent when nothing was published. */
  stream_seq?: number;
  /** The replay's new deadline (work-stream letters), epoch ms. */
  deadline_at?: number;
  /** Whether the letter was deleted from the dead-letter stream. */
  deleted: boolean;
}

const FETCH_EXPIRES_MS = 5_000;

/**
 * Lists dead letters, oldest first, without consuming them: an ordered consumer (no acks,
 * in memory, deleted afterwards) reads the stream. Throws `invalid_request` for a bad
 * option, `unavailable` when the dead-letter stream does not exist.
 */
export async function listDeadLetters(
  nc: NatsConnection,
  subjects: Subjects,
  options: ListDeadLettersOptions = {},
): Promise<DeadLetter[]> {
  const limit = options.limit ?? Defaults.deadLetterListLimit;
  if (!Number.isSafeInteger(limit) || limit <= 0) {
    throw new ToolmeshError(ErrorCode.InvalidRequest, "limit must be a positive integer", {
      details: { limit },
    });
  }
  const filter = options.tool === undefined ? subjects.allDlq : subjects.dlq(options.tool);
  const js = jetstream(nc);
  const stream = subjects.streams.dlq;
  const reader = await js.consumers
    .get(stream, { filter_subjects: filter, deliver_policy: DeliverPolicy.All })
    .catch((err: unknown) => {
      throw streamError(err, stream);
    });
  const letters: DeadLetter[] = [];
  const evidence = new EvidenceReader(nc, subjects);
  try {
    let pending = (await reader.info()).num_pending;
    while (pending > 0 && letters.length < limit) {
      const batch = await reader.fetch({
        max_messages: Math.min(pending, limit - letters.length),
        expires: FETCH_EXPIRES_MS,
      });
      let received = 0;
      for await (const msg of batch) {
        received++;
        const letter = describeLetter(subjects, {
          seq: msg.seq,
          subject: msg.subject,
          time: msg.time,
          headers: msg.headers,
          data: msg.data,
        });
        letters.push(await evidence.mark(letter, msg.data));
        pending = msg.info.pending;
        if (pending === 0 || letters.length >= limit) break;
      }
      if (received === 0) break; // deleted meanwhile: nothing more to read
    }
  } finally {
    await reader.delete().catch(() => undefined);
  }
  return letters;
}

/**
 * One dead letter with its decoded body. Throws `invalid_request` for a sequence that holds
 * no letter, `unavailable` when the dead-letter stream does not exist.
 */
export async function showDeadLetter(
  nc: NatsConnection,
  subjects: Subjects,
  seq: number,
): Promise<DeadLetterDetail> {
  const jsm = await jetstreamManager(nc);
  const { stored, letter } = await getLetter(jsm, subjects, seq);
  const body = decodeJsonOrUndefined(stored.data);
  return body === undefined
    ? { ...letter, body_base64: Buffer.from(stored.data).toString("base64") }
    : { ...letter, body };
}

/**
 * Puts a dead letter back in line and deletes it from the dead-letter stream once it is.
 *
 * **An explicit operator override of "exactly one final message per call".** The call already
 * ended with a `tool_error` (`details.dead_letter: true`) when it was dead-lettered; the replay
 * runs it again and ends it with a second, new final message on the same session and result
 * subject (same `tool_call_id`). Use it once the cause is fixed (a tool that crashed its
 * executor, a bug in the resolver).
 *
 * The replay runs under a new idempotency key `{original}#replay-{seq}`, which is also the
 * republished message's `Nats-Msg-Id`. Every id derived from the key (work message id, call
 * record, final message id `result:{key}`) is therefore new: re-using the old key would have
 * the new final message dropped as a duplicate of the dead-letter answer by the sessions
 * stream's duplicate window. The record of the original key keeps the dead-letter answer, so a
 * resubmission under that key is still answered with it; the caller cancels the replay with
 * `idempotency_key` set to the new key. A key longer than the id limit is replaced by its
 * SHA-256 before the suffix.
 *
 * - A work-stream letter (a resolved call) is republished on its work subject with the new key
 *   and a fresh deadline (`now + timeout_ms`, this host's clock); the new key is recorded as an
 *   accepted call in the call store first and the work carries the deadline headers, as the
 *   resolver's does, so the replay also ends by its deadline if no executor takes it.
 * - A calls-stream letter (a call request) is republished on its call subject with the new key
 *   as `idempotency_key`; the resolver resolves it again as a new call.
 * - Letters whose body holds no call (foreign bytes) are refused with `invalid_request`:
 *   replaying them could only dead-letter them again.
 *
 * Replaying the same letter twice is harmless: the message id deduplicates the publication and
 * the call store tells an already-finished replay (`already_done`). The letter is deleted only
 * after the publication was acknowledged, so a failed replay leaves it in place.
 *
 * Throws `invalid_request` for an unknown sequence or a letter that cannot be replayed,
 * `unavailable` (retryable) when NATS fails.
 */
export async function replayDeadLetter(
  nc: NatsConnection,
  subjects: Subjects,
  seq: number,
  options: ReplayDeadLetterOptions = {},
): Promise<ReplayOutcome> {
  const jsm = await jetstreamManager(nc);
  const { stored, letter } = await getLetter(jsm, subjects, seq);
  const replay: LetterReplay = { nc, js: jetstream(nc), subjects, seq, letter, options };
  const raw = decodeJsonOrUndefined(stored.data);
  let outcome: Omit<ReplayOutcome, "deleted">;
  if (subjects.isWorkStream(letter.stream)) {
    const call = await recordedCall(replay, raw);
    outcome = await replayWork(replay, call, { ...(raw as Record<string, unknown>), ...call });
  } else if (subjects.isCallsStream(letter.stream)) {
    const parsed = CallRequestSchema.safeParse(raw);
    if (!parsed.success) throw notReplayable(letter, "its body is not a call request");
    if (subjects.parseSessionSubject(letter.subject) === undefined)
      throw notReplayable(letter, `${letter.subject} is not a call subject`);
    outcome = await replayCall(replay, parsed.data, raw as Record<string, unknown>);
  } else {
    throw notReplayable(
      letter,
      letter.stream === ""
        ? "it does not say which stream it came from"
        : `it came from ${letter.stream}, not from the work or calls stream`,
    );
  }
  const deleted = await jsm.streams.deleteMessage(subjects.streams.dlq, seq).catch(() => false);
  return { ...outcome, deleted };
}

/** One replay of one dead letter: what each of its steps needs. */
interface LetterReplay {
  nc: NatsConnection;
  js: JetStreamClient;
  subjects: Subjects;
  seq: number;
  letter: DeadLetter;
  options: ReplayDeadLetterOptions;
}

/**
 * The call a work-stream letter holds, as the mesh recorded it. Throws `invalid_request` for a
 * body that is not a resolved call, `permission_denied` for a letter naming a call the mesh
 * never routed to that work.
 */
async function recordedCall(replay: LetterReplay, raw: unknown): Promise<ResolvedCall> {
  const { nc, subjects, seq, letter, options } = replay;
  const parsed = ResolvedCallSchema.safeParse(raw);
  if (!parsed.success) throw notReplayable(letter, "its body is not a resolved call");
  const checked = await new EvidenceReader(nc, subjects, options.callRetentionMs).check(
    letter,
    parsed.data,
  );
  if (checked.status === "suspect") {
    throw new ToolmeshError(
      ErrorCode.PermissionDenied,
      `dead letter ${seq} is not replayed: ${checked.why}`,
      {
        retryable: false,
        details: {
          seq,
          stream: letter.stream,
          tenant: parsed.data.address.tenant,
          suspect: checked.why,
        },
      },
    );
  }
  // The call is the mesh's own record of it, not what the letter says (ADR 0051); only the
  // resolved arguments come from the letter, which the record does not keep.
  const { record } = checked;
  return {
    ...parsed.data,
    idempotency_key: record.idempotency_key,
    call_id: record.call_id,
    session_id: record.session_id,
    address: record.address,
    tool: record.tool,
  };
}

/**
 * Republishes a work-stream letter's call under its replay key with a fresh deadline, after
 * recording the key as an accepted call.
 */
async function replayWork(
  replay: LetterReplay,
  call: ResolvedCall,
  body: Record<string, unknown>,
): Promise<Omit<ReplayOutcome, "deleted">> {
  const { seq, letter, options } = replay;
  const key = replayKey(call.idempotency_key, seq);
  const msgId = callKey(call.address, key);
  const deadlineAt = (options.now ?? Date.now()) + call.timeout_ms;
  const common = {
    seq,
    stream: letter.stream,
    subject: letter.subject,
    msg_id: msgId,
    idempotency_key: key,
    original_idempotency_key: call.idempotency_key,
    call_id: call.call_id,
    session_id: call.session_id,
    tool: call.tool,
  };
  const accepted = await acceptReplay(replay, call, key, deadlineAt);
  if (accepted.status === "done") return { ...common, status: "already_done" };
  const recordedDeadline =
    accepted.status === "in_flight" ? accepted.record.deadline_at : deadlineAt;
  const replayed = { ...body, idempotency_key: key, deadline_at: recordedDeadline };
  // Headed like the resolver's work, so the deadline keeper ends the replay at its deadline
  // if no executor does.
  const ack = await publishDurable(replay.js, letter.subject, replayed, {
    msgId,
    headers: deadlineHeaders({
      address: call.address,
      idempotency_key: key,
      deadline_at: recordedDeadline,
    }),
  });
  return { ...common, status: "replayed", stream_seq: ack.seq, deadline_at: recordedDeadline };
}

/**
 * Records the replay key as an accepted call in the call store. Throws
 * `idempotency_conflict` when the key is already another call's.
 */
async function acceptReplay(
  replay: LetterReplay,
  call: ResolvedCall,
  key: string,
  deadlineAt: number,
): Promise<Exclude<AcceptOutcome, { status: "conflict" }>> {
  const { nc, subjects, seq, options } = replay;
  const store = await withNatsErrors(() =>
    CallStore.open(nc, {
      subjects,
      // An operator's tool: the bucket is used as the services set it up.
      existing: "keep",
      ...(options.callRetentionMs === undefined ? {} : { retentionMs: options.callRetentionMs }),
    }),
  );
  const accepted = await withNatsErrors(() =>
    store.accept({
      idempotency_key: key,
      call_id: call.call_id,
      session_id: call.session_id,
      address: call.address,
      tool: call.tool,
      args_hash: argumentsHash(call.arguments),
      state: "accepted",
      deadline_at: deadlineAt,
    }),
  );
  // "in_flight": an earlier replay recorded the key and may not have published; the
  // message id makes publishing again harmless.
  if (accepted.status === "conflict") {
    throw new ToolmeshError(
      ErrorCode.IdempotencyConflict,
      `idempotency key "${key}" is already used by another call`,
      { details: { seq, idempotency_key: key } },
    );
  }
  return accepted;
}

/** Republishes a calls-stream letter's request under its replay key, to be resolved again. */
async function replayCall(
  replay: LetterReplay,
  request: CallRequest,
  body: Record<string, unknown>,
): Promise<Omit<ReplayOutcome, "deleted">> {
  const { subjects, seq, letter } = replay;
  const original = idempotencyKeyOf(request, request.tool_call.id);
  const key = replayKey(original, seq);
  const msgId = replayMsgId(subjects.streams.dlq, seq);
  const ack = await publishDurable(
    replay.js,
    letter.subject,
    { ...body, idempotency_key: key },
    { msgId },
  );
  return {
    seq,
    status: "replayed",
    stream: letter.stream,
    subject: letter.subject,
    msg_id: msgId,
    idempotency_key: key,
    original_idempotency_key: original,
    call_id: request.tool_call.id,
    session_id: request.session_id,
    tool: request.tool_call.function.name,
    stream_seq: ack.seq,
  };
}

/** `{key}#replay-{seq}`, within the id length limit. */
function replayKey(key: string, seq: number): string {
  const suffix = `#replay-${seq}`;
  if (key.length + suffix.length <= MAX_ID_LENGTH) return `${key}${suffix}`;
  return `${createHash("sha256").update(key).digest("hex")}${suffix}`;
}

/** A dead letter as stored, and described. */
async function getLetter(
  jsm: JetStreamManager,
  subjects: Subjects,
  seq: number,
): Promise<{ stored: StoredMsg; letter: ReturnType<typeof describeLetter> }> {
  if (!Number.isSafeInteger(seq) || seq <= 0) {
    throw new ToolmeshError(
      ErrorCode.InvalidRequest,
      "a dead letter's sequence is a positive integer",
      {
        details: { seq },
      },
    );
  }
  const stream = subjects.streams.dlq;
  const stored = await jsm.streams.getMessage(stream, { seq }).catch((err: unknown) => {
    throw streamError(err, stream);
  });
  if (stored === null) {
    throw new ToolmeshError(ErrorCode.InvalidRequest, `no dead letter with sequence ${seq}`, {
      details: { seq, stream },
    });
  }
  const letter = describeLetter(subjects, {
    seq: stored.seq,
    subject: stored.subject,
    time: stored.time,
    headers: stored.header,
    data: stored.data,
  });
  return { stored, letter };
}

function describeLetter(
  subjects: Subjects,
  msg: { seq: number; subject: string; time: Date; headers?: MsgHdrs; data: Uint8Array },
): DeadLetter {
  const h = msg.headers;
  const body = decodeJsonOrUndefined(msg.data);
  const stream = h?.get(Header.DlqStream) ?? "";
  let call:
    { tool: string; call_id: string; session_id: string; key: string; tenant?: string } | undefined;
  if (subjects.isWorkStream(stream)) {
    const parsed = ResolvedCallSchema.safeParse(body);
    if (parsed.success) {
      const c = parsed.data;
      call = {
        tool: c.tool,
        call_id: c.call_id,
        session_id: c.session_id,
        key: c.idempotency_key,
        tenant: c.address.tenant,
      };
    }
  } else if (subjects.isCallsStream(stream)) {
    const parsed = CallRequestSchema.safeParse(body);
    if (parsed.success) {
      const r = parsed.data;
      call = {
        tool: r.tool_call.function.name,
        call_id: r.tool_call.id,
        session_id: r.session_id,
        key: idempotencyKeyOf(r, r.tool_call.id),
        ...withTenant(subjects.parseSessionSubject(h?.get(Header.DlqSubject) ?? "")?.tenant),
      };
    }
  }
  const originalSeq = nonNegativeInt(h?.get(Header.DlqSequence));
  return {
    seq: msg.seq,
    tool: call?.tool ?? msg.subject.split(".").pop() ?? "",
    time: msg.time.toISOString(),
    reason: h?.get(Header.DlqReason) ?? "",
    deliveries: nonNegativeInt(h?.get(Header.DlqDeliveries)) ?? 0,
    stream,
    subject: h?.get(Header.DlqSubject) ?? "",
    ...(originalSeq === undefined ? {} : { original_seq: originalSeq }),
    ...(call === undefined
      ? {}
      : {
          call_id: call.call_id,
          session_id: call.session_id,
          idempotency_key: call.key,
          ...withTenant(call.tenant),
        }),
  };
}

function withTenant(tenant: string | undefined): { tenant?: string } {
  return tenant === undefined ? {} : { tenant };
}

/**
 * Reads the call records dead letters are checked against, opening the calls bucket once, on
 * the first work-stream letter.
 */
class EvidenceReader {
  #store: Promise<CallStore> | undefined;

  constructor(
    private readonly nc: NatsConnection,
    private readonly subjects: Subjects,
    private readonly callRetentionMs?: number,
  ) {}

  /** The letter, marked `suspect` when the mesh never routed the call it names to its work. */
  async mark(letter: DeadLetter, data: Uint8Array): Promise<DeadLetter> {
    if (!this.subjects.isWorkStream(letter.stream)) return letter;
    const parsed = ResolvedCallSchema.safeParse(decodeJsonOrUndefined(data));
    if (!parsed.success) return letter;
    const checked = await this.check(letter, parsed.data);
    return checked.status === "suspect" ? { ...letter, suspect: checked.why } : letter;
  }

  async check(letter: DeadLetter, call: ResolvedCall): Promise<LetterEvidence> {
    this.#store ??= withNatsErrors(() =>
      CallStore.open(this.nc, {
        subjects: this.subjects,
        // An operator's tool: the bucket is used as the services set it up.
        existing: "keep",
        ...(this.callRetentionMs === undefined ? {} : { retentionMs: this.callRetentionMs }),
      }),
    );
    const store = await this.#store;
    return withNatsErrors(() => letterEvidence(store, this.subjects, letter, call));
  }
}

function notReplayable(letter: DeadLetter, why: string): ToolmeshError {
  return new ToolmeshError(
    ErrorCode.InvalidRequest,
    `dead letter ${letter.seq} cannot be replayed: ${why}`,
    {
      retryable: false,
      details: { seq: letter.seq, stream: letter.stream, reason: letter.reason },
    },
  );
}

/** A stream's failure as the operator sees it: a missing stream says no service has run. */
export function streamError(err: unknown, stream: string): ToolmeshError {
  if (err instanceof JetStreamApiError && err.code === JetStreamApiCodes.StreamNotFound) {
    return new ToolmeshError(
      ErrorCode.Unavailable,
      `stream ${stream} does not exist: no toolmesh service has run with this prefix`,
      { details: { stream }, cause: err },
    );
  }
  return ensureError(err, ErrorCode.Unavailable);
}

async function withNatsErrors<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    throw ensureError(err, ErrorCode.Unavailable);
  }
}

function nonNegativeInt(text: string | undefined): number | undefined {
  const n = Number(text);
  return text !== undefined && text !== "" && Number.isSafeInteger(n) && n >= 0 ? n : undefined;
}
