import type { Msg, MsgHdrs, Subscription } from "@nats-io/nats-core";
import type { StoredMsg } from "@nats-io/jetstream";
import type { AbortMessage, CallRecord, ResolvedCall, Subjects } from "@toolmesh/protocol";
import {
  Defaults,
  ErrorCode,
  Header,
  ResolvedCallSchema,
  ToolmeshError,
  callKey,
  callKeyOfResultMsgId,
  decodeJsonOrUndefined,
  errorToolMessage,
} from "@toolmesh/protocol";
import { Semaphore, nextMessage, publishEphemeral, tracedHeaders } from "@toolmesh/nats";
import type { ControlDeps } from "./deps.js";
import type { Watched } from "./watched-calls.js";
import { WatchedCalls } from "./watched-calls.js";

/**
 * The headers the deadline keeper reads on a work message: the call's deadline and its key.
 * Every publisher of work (the resolver, a dead-letter replay) sets them; `headers` defaults
 * to a fresh set with the trace context.
 */
export function deadlineHeaders(
  call: Pick<ResolvedCall, "address" | "idempotency_key" | "deadline_at">,
  headers: MsgHdrs = tracedHeaders(),
): MsgHdrs {
  headers.set(Header.Deadline, String(call.deadline_at));
  headers.set(Header.CallKey, callKey(call.address, call.idempotency_key));
  return headers;
}

/** A final message as the keeper saw it go by: its subject, size and tool. */
export interface FinalSeen {
  subject: string;
  /** Its body's size in bytes. */
  bytes: number;
  /** The tool it ends a call of; undefined when it does not say. Read only when asked. */
  tool: () => string | undefined;
}

/** Options of {@link startDeadlineKeeper}. */
export interface DeadlineKeeperOptions {
  /** Most work messages read to find one whose sequence is not known. Default 10 000. */
  scanLimit?: number;
  /** Shown every final message seen go by. */
  onResult?: ((result: FinalSeen) => void) | undefined;
}

/**
 * What the keeper follows: each kind's republished headers when every stream of that kind
 * republishes them (ADR 0066), else the stored subjects themselves, bodies and all.
 */
interface Feeds {
  workHeads: boolean;
  resultHeads: boolean;
}

// Timers are re-armed at least this often, so a long wait never overflows setTimeout.
const MAX_WAIT_MS = 3_600_000;
// A call that could not be ended (NATS trouble) is tried again this much later.
const RETRY_MS = 500;

/**
 * Keeps the deadlines of the calls in the work stream, with no message of its own per call.
 *
 * The work stream holds exactly the calls not yet ended: an executor acknowledges work only
 * once its call ended; the deadline keeper, the dead-letter keeper and reconciliation remove
 * work only after its call ended. The keeper learns of work from a core subscription to the
 * work subjects (the headers of {@link deadlineHeaders}), and at start or after a reconnect
 * from the stream itself; it forgets a call when it sees the call's final message on a core
 * subscription to the results. At a deadline it looks for the work: still there, the call is
 * ended with `deadline_exceeded` through the call store (one final message however many keepers
 * act), `control.abort` goes out when this keeper ended it, and the work is deleted; gone, the
 * call ended, unless its record says otherwise (the work was lost): then it is ended the same way. Why not a consumer on the work stream: a work queue refuses consumers without acks
 * and consumers whose filters overlap the executors' (docs/adr/0028).
 */
export async function startDeadlineKeeper(
  deps: ControlDeps,
  options: DeadlineKeeperOptions = {},
): Promise<DeadlineKeeper> {
  const keeper = new DeadlineKeeper(deps, options, await feedsOf(deps));
  // Registered at the server before the stream is read: work published meanwhile is seen live.
  await deps.nc.flush();
  keeper.followClock();
  return keeper;
}

/** A running deadline keeper ({@link startDeadlineKeeper}). */
export class DeadlineKeeper {
  readonly #deps: ControlDeps;
  readonly #scanLimit: number;
  readonly #calls = new WatchedCalls();
  readonly #slots = new Semaphore(16);
  readonly #subscriptions: Subscription[];
  #traffic = 0;
  #stopped = false;
  #timer: NodeJS.Timeout | undefined;
  #timerAt = Number.POSITIVE_INFINITY;
  #stopFollowingClock: () => void = () => undefined;

  /** @internal made by {@link startDeadlineKeeper} only */
  constructor(deps: ControlDeps, options: DeadlineKeeperOptions, feeds: Feeds) {
    this.#deps = deps;
    this.#scanLimit = options.scanLimit ?? Defaults.streamScanLimit;
    const { subjects } = deps;
    // The mesh's work stream and every tool owner's (ADR 0041).
    const work = feeds.workHeads
      ? [subjects.allWorkHeads]
      : [subjects.allWork, subjects.allOwnerWork];
    this.#subscriptions = [
      ...work.map((subject) =>
        this.#follow(subject, "the work stream", (msg) => {
          const seen = republished(msg, subjects);
          const found = readWork(msg.headers, msg.data);
          if (found !== undefined)
            this.#watch(found.key, found.deadline, seen?.subject ?? msg.subject, seen?.seq);
        }),
      ),
      this.#follow(
        feeds.resultHeads ? subjects.allResultHeads : subjects.allResults,
        "the results",
        (msg) => {
          this.#settled(msg);
          options.onResult?.(finalSeen(msg, subjects));
        },
      ),
    ];
  }

  #follow(subject: string, what: string, take: (msg: Msg) => void): Subscription {
    return this.#deps.nc.subscribe(subject, {
      callback: (err, msg) => {
        if (err !== null) {
          this.#deps.log.error({ err }, `deadline keeper cannot follow ${what}`);
          return;
        }
        this.#traffic++;
        take(msg);
      },
    });
  }

  /** Calls watched now. */
  get watched(): number {
    return this.#calls.size;
  }

  /** Work and final messages seen so far: unchanged while the mesh is idle. */
  get traffic(): number {
    return this.#traffic;
  }

  /**
   * Re-arms the timer whenever the estimate of the server's clock is corrected: a backlog read
   * after a restart carries only old timestamps, which put the estimate behind.
   * @internal called once by {@link startDeadlineKeeper}
   */
  followClock(): void {
    this.#stopFollowingClock = this.#deps.plane.clock.onChange(() => {
      if (!this.#stopped) this.#arm();
    });
  }

  /**
   * Reads the whole work stream (at start, and after a reconnect, when work and results may
   * have been missed) and watches every call found there. Calls watched before whose work is
   * no longer there ended meanwhile and are dropped, unless their record is still open.
   */
  async replay(): Promise<void> {
    const { plane, subjects, log } = this.#deps;
    const mark = this.#calls.beginReplay();
    // One fresh reading of the server's clock before the backlog comes in (and the deadlines
    // read below are armed): without it a restarted resolver keeps them late.
    try {
      const { serverMs, localMs } = await plane.store.serverTime();
      plane.clock.anchor(serverMs, localMs);
    } catch (err) {
      log.warn({ err }, "cannot read the server's clock; deadlines follow message timestamps");
    }
    const streams = [{ stream: subjects.streams.work, filter: subjects.allWork }];
    for await (const stream of plane.jsm.streams.names(subjects.allOwnerWork))
      if (subjects.isWorkStream(stream)) streams.push({ stream, filter: subjects.allOwnerWork });
    for (const { stream, filter } of streams) {
      for (let from = 1; !this.#stopped;) {
        const msg = await this.#nextMessage(stream, from, filter);
        if (msg === null) break;
        from = msg.seq + 1;
        const work = readWork(msg.header, msg.data);
        if (work !== undefined) this.#watch(work.key, work.deadline, msg.subject, msg.seq);
      }
    }
    const left = this.#calls.endReplay(mark);
    this.#arm();
    await this.#keepLost(left);
  }

  /**
   * Of the calls whose work a read of the stream no longer found, watches again those whose
   * record is still open (their work was lost), so that their deadline ends them; a record that
   * cannot be read counts as open. The others ended while this keeper looked away.
   */
  async #keepLost(left: readonly Watched[]): Promise<void> {
    for (const entry of left) {
      if (this.#stopped) return;
      const known = await this.#deps.plane.store.byKey(entry.key).catch(() => "unread" as const);
      if (known === undefined || (known !== "unread" && known.record.state === "done")) continue;
      if (this.#calls.watchLost(entry) && entry.deadline < this.#timerAt) this.#arm();
    }
  }

  stop(): void {
    this.#stopped = true;
    this.#stopFollowingClock();
    clearTimeout(this.#timer);
    for (const sub of this.#subscriptions) sub.unsubscribe();
  }

  #watch(key: string, deadline: number, subject: string, seq: number | undefined): void {
    if (this.#calls.watch(key, deadline, subject, seq) && deadline < this.#timerAt) this.#arm();
  }

  #settled(msg: Msg): void {
    const key = callKeyOfResultMsgId(msg.headers?.get(Header.MsgId) ?? "");
    if (key !== undefined) this.#calls.settle(key);
  }

  /** Arms the one timer for the earliest deadline still watched. */
  #arm(): void {
    const next = this.#calls.nextDeadline();
    clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#timerAt = Number.POSITIVE_INFINITY;
    if (next === undefined || this.#stopped) return;
    this.#timerAt = next;
    const wait = Math.min(Math.max(0, next - this.#deps.plane.clock.now()), MAX_WAIT_MS);
    this.#timer = setTimeout(() => this.#fire(), wait);
    this.#timer.unref();
  }

  #fire(): void {
    for (const entry of this.#calls.takeDue(this.#deps.plane.clock.now())) void this.#expire(entry);
    this.#arm();
  }

  async #expire(entry: Watched): Promise<void> {
    const { plane, subjects, log } = this.#deps;
    await this.#slots.acquire();
    const stream = subjects.workStreamOf(entry.subject) ?? subjects.streams.work;
    try {
      const stored =
        entry.workLost === true
          ? undefined
          : entry.seq === undefined
            ? await this.#find(stream, entry)
            : await this.#messageAt(stream, entry.seq, entry.key);
      if (stored === undefined) {
        await this.#endWithoutWork(entry, stream);
        return;
      }
      const call = ResolvedCallSchema.safeParse(decodeJsonOrUndefined(stored.data)).data;
      if (call === undefined) return; // not a call: the executor dead-letters it
      await this.#end(call, undefined, entry.key, stream);
      // Work nobody took must not outlive its call. Removed after the call ended, so that a
      // keeper dying in between leaves work behind (taken and dropped by an executor, or ended
      // again by the next keeper), never an open call without work.
      await plane.jsm.streams.deleteMessage(stream, stored.seq).catch(() => false);
    } catch (err) {
      log.warn({ err, key: entry.key }, "cannot end the call at its deadline yet; retrying");
      if (!this.#stopped && !this.#calls.has(entry.key))
        this.#watch(entry.key, plane.clock.now() + RETRY_MS, entry.subject, entry.seq);
    } finally {
      this.#slots.release();
    }
  }

  /**
   * A call whose work is gone at its deadline. Work leaves only once its call ended, so the
   * record is normally `done`; a record still open means the work was lost (a server failing
   * before it replicated a write, a stream limit), and the call is ended like any other past its
   * deadline rather than left without an answer.
   */
  async #endWithoutWork(entry: Watched, stream: string): Promise<void> {
    const known = await this.#deps.plane.store.byKey(entry.key);
    if (known === undefined || known.record.state === "done") return;
    const { record } = known;
    this.#deps.log.warn(
      { callId: record.call_id, tool: record.tool, sessionId: record.session_id, stream },
      "call's work is gone though the call never ended; ending it at its deadline",
    );
    await this.#end(record, known, entry.key, stream);
  }

  /** Ends a call with `deadline_exceeded`; when this keeper's message won, aborts any attempt. */
  async #end(
    call: DeadlineTarget,
    known: { record: CallRecord; revision: number } | undefined,
    key: string,
    stream: string,
  ): Promise<void> {
    const { plane, subjects, log, nc } = this.#deps;
    if (!(await plane.finalize(call, deadlineMessage(call), known))) return;
    publishEphemeral(nc, subjects.abortOf(stream), {
      call_key: key,
      reason: "deadline_exceeded",
    } satisfies AbortMessage);
    log.info(
      { callId: call.call_id, tool: call.tool, sessionId: call.session_id },
      "call passed its deadline",
    );
  }

  /** The work message at `seq`, if it is still there and still the call's. */
  async #messageAt(stream: string, seq: number, key: string): Promise<StoredMsg | undefined> {
    const msg = await this.#deps.plane.jsm.streams.getMessage(stream, { seq });
    return msg !== null && keyOf(msg) === key ? msg : undefined;
  }

  /** Looks for a call's work among the messages of its subject, oldest first. */
  async #find(stream: string, entry: Watched): Promise<StoredMsg | undefined> {
    let from = 1;
    for (let scanned = 0; scanned < this.#scanLimit; scanned++) {
      const msg = await this.#nextMessage(stream, from, entry.subject);
      if (msg === null) return undefined;
      if (keyOf(msg) === entry.key) return msg;
      from = msg.seq + 1;
    }
    this.#deps.log.warn(
      { key: entry.key, scanLimit: this.#scanLimit },
      "call's work not found within the scan limit",
    );
    return undefined;
  }

  #nextMessage(stream: string, from: number, filter: string): Promise<StoredMsg | null> {
    return nextMessage(this.#deps.plane.jsm, stream, from, filter);
  }
}

/** The deadline and key of a work message: from its headers, or its body (older publishers). */
function readWork(
  headers: MsgHdrs | undefined,
  data: Uint8Array,
): { key: string; deadline: number } | undefined {
  // Copied: a header value is a slice of the whole header block, which it would keep alive for
  // as long as the call is watched.
  const key = Buffer.from(headers?.get(Header.CallKey) ?? "").toString();
  const deadline = Number(headers?.get(Header.Deadline) ?? "");
  if (key !== "" && Number.isFinite(deadline) && deadline > 0) return { key, deadline };
  const call = ResolvedCallSchema.safeParse(decodeJsonOrUndefined(data)).data;
  return call === undefined
    ? undefined
    : { key: callKey(call.address, call.idempotency_key), deadline: call.deadline_at };
}

/**
 * Where a message a stream republished under the heads (`{p}.v1.heads.>`) was stored; undefined
 * for a message as it was published (whatever headers it carries).
 */
function republished(
  msg: Msg,
  subjects: Subjects,
): { subject: string; seq: number | undefined } | undefined {
  if (!msg.subject.startsWith(subjects.allWorkHeads.slice(0, -"work.>".length))) return undefined;
  const subject = msg.headers?.get(Header.RepublishedSubject);
  if (subject === undefined || subject === "") return undefined;
  const seq = Number(msg.headers?.get(Header.RepublishedSequence));
  return { subject, seq: Number.isSafeInteger(seq) && seq > 0 ? seq : undefined };
}

/** A final message seen, whole or as its republished headers. */
export function finalSeen(msg: Msg, subjects: Subjects): FinalSeen {
  const heads = republished(msg, subjects);
  if (heads === undefined)
    return { subject: msg.subject, bytes: msg.data.length, tool: () => toolOf(msg) };
  return {
    subject: heads.subject,
    bytes: Number(msg.headers?.get(Header.RepublishedSize)) || 0,
    tool: () => toolOf(msg),
  };
}

/** The tool a final message names: its header, else its body's `name` (when it has one). */
function toolOf(msg: Msg): string | undefined {
  const header = msg.headers?.get(Header.Tool);
  if (header !== undefined && header !== "") return header;
  const name = (decodeJsonOrUndefined(msg.data) as { name?: unknown } | undefined)?.name;
  return typeof name === "string" ? name : undefined;
}

/**
 * Which feeds the keeper follows (ADR 0066): a kind's republished headers when the mesh's
 * stream of that kind, and for work every owner's, republishes them; else (a stream made
 * before, on a server that cannot add a republish to it, or one that cannot be read) the
 * stored subjects.
 */
async function feedsOf({
  plane,
  subjects,
}: Pick<ControlDeps, "plane" | "subjects">): Promise<Feeds> {
  let workHeads = await republishes(plane, subjects.streams.work, subjects.allWorkHeads);
  try {
    for await (const stream of plane.jsm.streams.names(subjects.allOwnerWork))
      if (workHeads && subjects.isWorkStream(stream))
        workHeads = await republishes(plane, stream, subjects.allWorkHeads);
  } catch {
    workHeads = false;
  }
  return { workHeads, resultHeads: await resultHeadsRepublished({ plane, subjects }) };
}

/**
 * Where final messages are followed (read with {@link finalSeen}): their republished headers
 * when the sessions stream republishes them (ADR 0066), else the stored subjects.
 */
export async function followedResults(
  deps: Pick<ControlDeps, "plane" | "subjects">,
): Promise<string> {
  const { subjects } = deps;
  return (await resultHeadsRepublished(deps)) ? subjects.allResultHeads : subjects.allResults;
}

async function resultHeadsRepublished({
  plane,
  subjects,
}: Pick<ControlDeps, "plane" | "subjects">): Promise<boolean> {
  return republishes(plane, subjects.streams.sessions, subjects.allResultHeads);
}

/** Whether `stream` republishes the headers of what it stores under the wildcard `heads`. */
async function republishes(
  plane: ControlDeps["plane"],
  stream: string,
  heads: string,
): Promise<boolean> {
  const info = await plane.jsm.streams.info(stream).catch(() => undefined);
  const republish = info?.config.republish;
  return republish?.headers_only === true && republish.dest.startsWith(heads.slice(0, -1));
}

function keyOf(msg: StoredMsg): string | undefined {
  return readWork(msg.header, msg.data)?.key;
}

/** What the keeper needs of a call to end it: its work message, or its record. */
type DeadlineTarget = Pick<
  ResolvedCall,
  "call_id" | "tool" | "session_id" | "address" | "idempotency_key" | "deadline_at"
> & { timeout_ms?: number };

function deadlineMessage(call: DeadlineTarget) {
  const within = call.timeout_ms === undefined ? "by its deadline" : `within ${call.timeout_ms} ms`;
  return errorToolMessage(
    { tool_call_id: call.call_id, name: call.tool, session_id: call.session_id },
    new ToolmeshError(ErrorCode.DeadlineExceeded, `call ${call.call_id} did not finish ${within}`, {
      details: {
        deadline_at: call.deadline_at,
        ...(call.timeout_ms === undefined ? {} : { timeout_ms: call.timeout_ms }),
      },
    }),
  );
}
