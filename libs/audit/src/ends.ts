import type { NatsConnection } from "@nats-io/nats-core";
import type { JetStreamManager, JsMsg } from "@nats-io/jetstream";
import { DeliverPolicy, JetStreamApiError, jetstream, jetstreamManager } from "@nats-io/jetstream";
import { z } from "zod";
import type { Subjects, ToolMessage } from "@toolmesh/protocol";
import {
  Header,
  ToolMessageSchema,
  decodeJsonOrUndefined,
  finalEventMsgId,
} from "@toolmesh/protocol";
import type { ConsumerSpec, WorkLoop } from "@toolmesh/nats";
import {
  JsApiCode,
  Semaphore,
  durableConsumerSpec,
  ensureConsumer,
  heartbeatMsFor,
  startWorkLoop,
  warnUnavailable,
} from "@toolmesh/nats";
import type { AuditEventInput } from "./events.js";
import { AuditEventType } from "./events.js";
import { callEnded } from "./record.js";
import type { AuditTrailObserver } from "./trail.js";

/** What a final message's {@link Header.Ended} carries: its call's end, but for when and its id. */
const EndedSchema = z
  .object({
    by: z.string().min(1).max(1_024),
    type: z.enum([AuditEventType.Ended, AuditEventType.Cancelled, AuditEventType.DeadlineExceeded]),
    call_id: z.string(),
    session: z.string(),
    tool: z.string(),
    data: z.record(z.string(), z.unknown()),
  })
  .strict();

/**
 * The {@link Header.Ended} of a final message published by `by`: the end the resolvers record
 * from it, so that they need not read the message's body (ADR 0068). JSON with every character
 * past ASCII escaped, as a header carries it.
 */
export function endedHeader(message: ToolMessage, by: string): string {
  const { at: _at, ...ended } = callEnded(message);
  const json = JSON.stringify({ by, ...ended });
  return PAST_ASCII.test(json)
    ? json.replace(PAST_ASCII_ALL, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`)
    : json;
}

const PAST_ASCII = /[\u007f-\uffff]/;
const PAST_ASCII_ALL = new RegExp(PAST_ASCII.source, "g");

/** What {@link EndRecorder} records with: the resolver's own trail. */
export interface EndsTrail {
  readonly required: boolean;
  record(tenant: string, event: AuditEventInput): Promise<void>;
  tryRecord(tenant: string, event: AuditEventInput): Promise<boolean>;
}

/** Where {@link EndRecorder} reports what needs attention. */
export interface EndsLog {
  warn(fields: Record<string, unknown>, message: string): void;
  error(fields: Record<string, unknown>, message: string): void;
}

const ACK_WAIT_MS = 30_000;
/** Final messages one resolver holds at once while their ends are written. */
const SLOTS = 512;
/** Longest pause before a final message whose end could not be written is tried again. */
const RETRY_MAX_MS = 60_000;
/**
 * Most ends of one tenant a resolver hands back to be tried again since that tenant's last
 * write passed (each counted once, at its first hand-back): past it, its further ends are
 * dropped (counted, said once), so that a tenant whose trail stays unwritable cannot fill the
 * consumer's unacknowledged messages and stall every other tenant's.
 */
const HELD_MAX = 1_000;

/** Options of {@link EndRecorder.start}. */
export interface EndRecorderOptions {
  /** Counts the ends dropped ({@link HELD_MAX}). */
  observer?: Pick<AuditTrailObserver, "auditDropped"> | undefined;
  /** Default {@link HELD_MAX}. */
  heldMax?: number | undefined;
}

/**
 * The resolvers' consumer of the final messages: every one the sessions stream stores, from
 * when it is first made (not the ones before), kept until its end is written, however often
 * that takes (ADR 0068). It delivers headers only: a result is not sent again.
 */
export function auditEndsConsumerSpec(subjects: Subjects): ConsumerSpec {
  const spec = durableConsumerSpec({
    stream: subjects.streams.sessions,
    name: subjects.auditEndsConsumer,
    filterSubject: subjects.allResults,
    ackWaitMs: ACK_WAIT_MS,
    maxDeliver: -1,
    maxAckPending: 20_000,
  });
  return {
    ...spec,
    config: { ...spec.config, deliver_policy: DeliverPolicy.New, headers_only: true },
  };
}

/**
 * Records each final message the sessions stream stores as its call's end (ADR 0068), in the
 * tenant's chain, and acknowledges it once written: whatever published it (an executor, a
 * bridge, the control plane, a path added later) and whatever became of that process after.
 * Every resolver with a trail shares the one consumer. A tenant whose trail cannot be written
 * now gets its ends again later (backing off to a minute), while the others' go on; one that
 * has no audit stream has none to write (said once).
 */
export class EndRecorder {
  readonly #jsm: JetStreamManager;
  readonly #subjects: Subjects;
  readonly #trail: EndsTrail;
  readonly #log: EndsLog;
  readonly #options: EndRecorderOptions;
  readonly #toldNoStream = new Set<string>();
  /** Per tenant: ends handed back since its last write passed. */
  readonly #held = new Map<string, number>();
  #loop: WorkLoop | undefined;

  private constructor(
    jsm: JetStreamManager,
    subjects: Subjects,
    trail: EndsTrail,
    log: EndsLog,
    options: EndRecorderOptions,
  ) {
    this.#jsm = jsm;
    this.#subjects = subjects;
    this.#trail = trail;
    this.#log = log;
    this.#options = options;
  }

  /** Makes the consumer when missing and starts taking final messages. */
  static async start(
    nc: NatsConnection,
    subjects: Subjects,
    trail: EndsTrail,
    log: EndsLog,
    options: EndRecorderOptions = {},
  ): Promise<EndRecorder> {
    const jsm = await jetstreamManager(nc);
    await ensureConsumer(jsm, auditEndsConsumerSpec(subjects));
    const recorder = new EndRecorder(jsm, subjects, trail, log, options);
    recorder.#loop = await startWorkLoop({
      js: jetstream(nc),
      stream: subjects.streams.sessions,
      consumer: subjects.auditEndsConsumer,
      slots: new Semaphore(SLOTS),
      maxMessages: SLOTS / 2,
      heartbeatMs: heartbeatMsFor(ACK_WAIT_MS),
      handle: (msg) => recorder.#handle(msg),
      onConsumerUnavailable: warnUnavailable(log, subjects.auditEndsConsumer),
      onError: (err) => log.error({ err }, "audit end recorder error"),
    });
    return recorder;
  }

  /** Stops taking final messages; those whose ends are not written by `graceMs` come back. */
  async stop(graceMs: number): Promise<void> {
    await this.#loop?.stop(graceMs);
  }

  async #handle(msg: JsMsg): Promise<void> {
    const tenant = this.#subjects.parseResultSubject(msg.subject)?.address.tenant;
    const event = tenant === undefined ? undefined : await this.#endOf(msg);
    if (tenant === undefined || event === undefined) {
      this.#log.error(
        { subject: msg.subject, seq: msg.seq },
        "a final message whose end cannot be read (it is not one, or no longer stored): no call's end is recorded from it",
      );
      msg.term();
      return;
    }
    if (!this.#trail.required) {
      void this.#trail.record(tenant, event);
      msg.ack();
    } else if (await this.#trail.tryRecord(tenant, event)) {
      this.#held.delete(tenant);
      msg.ack();
    } else if (await this.#hasNoStream(tenant)) {
      msg.ack();
    } else {
      this.#handBack(tenant, msg);
    }
  }

  /**
   * Hands an end whose write failed back to be tried again later, backing off to a minute; past
   * the tenant's bound of ends handed back, drops it instead (said once until a write passes).
   */
  #handBack(tenant: string, msg: JsMsg): void {
    const tries = msg.info.deliveryCount;
    const held = this.#held.get(tenant) ?? 0;
    const max = this.#options.heldMax ?? HELD_MAX;
    // An end handed back before is held already (here or by another resolver).
    if (tries > 1 || held < max) {
      if (tries === 1) this.#held.set(tenant, held + 1);
      msg.nak(Math.min(1_000 * 2 ** Math.min(tries - 1, 6), RETRY_MAX_MS));
      return;
    }
    if (held === max) {
      this.#held.set(tenant, held + 1);
      this.#log.error(
        { tenant, held },
        "audit trail still cannot be written and this many of its calls' ends wait to be tried again: further ends are dropped until it can",
      );
    }
    this.#options.observer?.auditDropped();
    msg.term();
  }

  /**
   * The call's end a stored final message records, stored when it was, under an id of it: from
   * its {@link Header.Ended}, or (a publisher that set none) from its body, read from the stream.
   * Undefined when it is no final message.
   */
  async #endOf(msg: JsMsg): Promise<AuditEventInput | undefined> {
    const at = Math.floor(msg.info.timestampNanos / 1e6);
    // Every final message carries its id; a repeat of this one is recorded under the same.
    const id = finalEventMsgId(msg.headers?.get(Header.MsgId) || `seq:${msg.seq}`);
    const ended = EndedSchema.safeParse(parsedOrUndefined(msg.headers?.get(Header.Ended)));
    // Assigned, not spread before more fields: V8's slow path, on every call's end.
    if (ended.success) return Object.assign(ended.data, { at, id });
    const stored = await this.#jsm.streams.getMessage(this.#subjects.streams.sessions, {
      seq: msg.seq,
    });
    if (stored === null) return undefined;
    const message = ToolMessageSchema.safeParse(decodeJsonOrUndefined(stored.data));
    return message.success ? { ...callEnded(message.data, at), id } : undefined;
  }

  /** True when `tenant` has no audit stream: its calls' ends have nowhere to go (said once). */
  async #hasNoStream(tenant: string): Promise<boolean> {
    const stream = this.#subjects.auditStream(tenant);
    const missing = await this.#jsm.streams.info(stream).then(
      () => false,
      (err: unknown) => err instanceof JetStreamApiError && err.code === JsApiCode.StreamNotFound,
    );
    if (missing && !this.#toldNoStream.has(tenant)) {
      this.#toldNoStream.add(tenant);
      this.#log.warn(
        { tenant, stream },
        "tenant has no audit stream: its calls' ends are not recorded (toolmesh setup --tenants makes it)",
      );
    }
    return missing;
  }
}

/** `text` parsed as JSON; undefined when absent or not JSON. */
function parsedOrUndefined(text: string | undefined): unknown {
  if (!text) return undefined;
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}
