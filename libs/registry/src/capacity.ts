import { randomUUID } from "node:crypto";
import type { NatsConnection, Subscription } from "@nats-io/nats-core";
import type { Subjects } from "@toolmesh/protocol";
import { decodeJsonOrUndefined, encodeJson } from "@toolmesh/protocol";

// The capacity of a tool: what its executors run at once, all replicas together (ADR 0055).
// Every replica announces its concurrency and the tools it serves on its owner's capacity
// subject every period, and once more with concurrency 0 when it stops; every resolver sums
// the announcements it heard within the last LIVES periods, so a replica that dies stops
// counting within LIVES periods.

/** How often a replica announces its capacity, in ms. */
export const CAPACITY_PERIOD_MS = 2_000;
/** An announcement counts for this many periods after it is heard. */
const LIVES = 3;

/** What one replica announces: `{ instance, concurrency, tools }`. */
export interface CapacityAnnouncement {
  /** Unique per process: its announcements replace each other. */
  instance: string;
  /** Calls it runs at once, all its tools together; 0 when it stops. */
  concurrency: number;
  /** Names of the tools it serves. */
  tools: string[];
}

/** The announcement in `data`, or undefined when it is not one. */
export function parseCapacity(data: Uint8Array): CapacityAnnouncement | undefined {
  const body = decodeJsonOrUndefined(data) as Partial<CapacityAnnouncement> | undefined;
  if (body === null || typeof body !== "object") return undefined;
  const { instance, concurrency, tools } = body;
  if (typeof instance !== "string" || instance.length === 0 || instance.length > 128)
    return undefined;
  if (typeof concurrency !== "number" || !Number.isInteger(concurrency) || concurrency < 0)
    return undefined;
  if (!Array.isArray(tools) || !tools.every((t) => typeof t === "string")) return undefined;
  return { instance, concurrency, tools };
}

/** Options of {@link CapacityAnnouncer}. */
export interface CapacityAnnouncerOptions {
  nc: NatsConnection;
  subjects: Subjects;
  /** The owner the replica's tools are registered under. */
  owner: string;
  concurrency: number;
  /** The tools it serves now. */
  tools(): readonly string[];
  /** Default {@link CAPACITY_PERIOD_MS}. */
  periodMs?: number;
}

/** Announces one replica's capacity every period, and its end when it stops. */
export class CapacityAnnouncer {
  readonly #options: CapacityAnnouncerOptions;
  readonly #instance = randomUUID();
  readonly #timer: NodeJS.Timeout;

  constructor(options: CapacityAnnouncerOptions) {
    this.#options = options;
    this.#announce(options.concurrency);
    this.#timer = setInterval(
      () => this.#announce(options.concurrency),
      options.periodMs ?? CAPACITY_PERIOD_MS,
    ).unref();
  }

  /** Announces now (a tool was added or removed). */
  changed(): void {
    this.#announce(this.#options.concurrency);
  }

  /** Stops announcing and announces concurrency 0, so resolvers stop counting it at once. */
  stop(): void {
    clearInterval(this.#timer);
    this.#announce(0);
  }

  #announce(concurrency: number): void {
    const { nc, subjects, owner } = this.#options;
    if (nc.isClosed()) return;
    const body: CapacityAnnouncement = {
      instance: this.#instance,
      concurrency,
      tools: [...this.#options.tools()],
    };
    nc.publish(subjects.ownerCapacity(owner), encodeJson(body));
  }
}

/** Where {@link ToolCapacity} tells what it hears. */
export interface CapacityLog {
  debug(obj: object, msg: string): void;
  warn(obj: object, msg: string): void;
}

/** Options of {@link ToolCapacity}. */
export interface ToolCapacityOptions {
  nc: NatsConnection;
  subjects: Subjects;
  /** The owner a tool is registered under, undefined when it is not registered. */
  ownerOf(tool: string): string | undefined;
  /** Replicas heard, ended and expired at debug; malformed announcements (ignored) at warn. */
  log: CapacityLog;
  /** The period replicas announce with. Default {@link CAPACITY_PERIOD_MS}. */
  periodMs?: number;
  now?: () => number;
}

interface Replica {
  subject: string;
  concurrency: number;
  tools: Set<string>;
  heardAt: number;
}

/**
 * Sums the capacity announced for each tool by the replicas heard lately. A replica counts for
 * a tool only when it announced on the capacity subject of the tool's registered owner: an
 * owner's account carries only its own subject, so no owner can widen or narrow the capacity of
 * another's tools.
 */
export class ToolCapacity {
  readonly #options: ToolCapacityOptions;
  /** By subject and instance: an instance id on another owner's subject is another replica. */
  readonly #replicas = new Map<string, Replica>();
  readonly #sub: Subscription;

  constructor(options: ToolCapacityOptions) {
    this.#options = options;
    this.#sub = options.nc.subscribe(options.subjects.allOwnerCapacity, {
      callback: (err, msg) => {
        if (err === null) this.#heard(msg.subject, msg.data);
      },
    });
  }

  /** The tool's capacity: the summed concurrency of its replicas heard lately; 0 when none. */
  windowOf(tool: string): number {
    const owner = this.#options.ownerOf(tool);
    if (owner === undefined) return 0;
    const subject = this.#options.subjects.ownerCapacity(owner);
    const since = this.#now() - LIVES * (this.#options.periodMs ?? CAPACITY_PERIOD_MS);
    let sum = 0;
    for (const [key, replica] of this.#replicas) {
      if (replica.heardAt < since) {
        this.#replicas.delete(key);
        this.#options.log.debug({ replica: key }, "replica capacity expired");
      } else if (replica.subject === subject && replica.tools.has(tool)) sum += replica.concurrency;
    }
    return sum;
  }

  stop(): void {
    this.#sub.unsubscribe();
  }

  #heard(subject: string, data: Uint8Array): void {
    const body = parseCapacity(data);
    const { log } = this.#options;
    if (body === undefined) {
      log.warn(
        { subject },
        "capacity announcement ignored: not { instance, concurrency (integer ≥ 0), tools }",
      );
      return;
    }
    const key = `${subject} ${body.instance}`;
    if (body.concurrency === 0) {
      if (this.#replicas.delete(key)) log.debug({ replica: key }, "replica capacity ended");
      return;
    }
    if (!this.#replicas.has(key))
      log.debug(
        { replica: key, concurrency: body.concurrency, tools: body.tools },
        "replica capacity heard",
      );
    this.#replicas.set(key, {
      subject,
      concurrency: body.concurrency,
      tools: new Set(body.tools),
      heardAt: this.#now(),
    });
  }

  #now(): number {
    return (this.#options.now ?? Date.now)();
  }
}
