import { hash as digest } from "node:crypto";
import canonicalizeModule from "canonicalize";

// The package is CommonJS (`module.exports = fn`) with an ES-style `export default` in its types:
// under NodeNext the default import is that function at run time, whatever the types say.
const canonicalize = canonicalizeModule as unknown as (input: unknown) => string | undefined;
import type { AuditRecord } from "./events.js";

/** sha256 (hex) of the RFC 8785 canonical JSON of `value`. */
export function canonicalDigest(value: unknown): string {
  return digest("sha256", canonicalize(value) ?? "null", "hex");
}

/** The hash an event must carry: of all its fields but `hash`. */
export function recordHash(record: Omit<AuditRecord, "hash"> | AuditRecord): string {
  const { hash: _ignored, ...rest } = record as AuditRecord;
  return canonicalDigest(rest);
}

/** The place of the next event in a chain: the last event's sequence and hash. */
export interface ChainTail {
  seq: number;
  hash: string | null;
  /** The last event's id: whether a write whose answer was lost landed. */
  id?: string | undefined;
}

/**
 * Seals `event` as the event after `tail`, with the JSON text to store: its canonical JSON
 * (what the hash is of) with `hash` added last, so the event is serialized once.
 */
export function sealForStore(
  event: Omit<AuditRecord, "hash" | "seq" | "prev">,
  tail: ChainTail,
): { record: AuditRecord; data: string } {
  // Copied by assignment: a spread into a literal with more fields after it takes V8's slow path
  // (microseconds per event, on every call's path).
  const record = Object.assign({}, event) as AuditRecord;
  record.seq = tail.seq + 1;
  record.prev = tail.hash;
  const open = canonicalOpen(record);
  // The hash is of every field but itself: added once the text is made.
  record.hash = digest("sha256", `${open}}`, "hex");
  return { record, data: `${open},"hash":"${record.hash}"}` };
}

/** An event's fields but `hash`, in the order RFC 8785 sorts them (by UTF-16 code units). */
const SEALED_FIELDS = [
  "at",
  "by",
  "call_id",
  "data",
  "id",
  "prev",
  "seq",
  "session",
  "tenant",
  "tool",
  "type",
  "v",
] as const;

/**
 * The canonical JSON of `record` without its closing brace. An event's own fields are known, so
 * they are written in their canonical order and only each value is canonicalized (`data` is the
 * one object); a record with any other field is canonicalized whole. Equal to
 * `canonicalize(record)` but the brace (`chain.test.ts` compares them).
 */
function canonicalOpen(record: Omit<AuditRecord, "hash">): string {
  const fields = record as Record<string, unknown>;
  let text = "{";
  let written = 0;
  for (const key of SEALED_FIELDS) {
    const value = fields[key];
    if (value === undefined) continue;
    text += `${written === 0 ? "" : ","}"${key}":${canonicalize(value) as string}`;
    written++;
  }
  let present = 0;
  for (const key in fields) if (fields[key] !== undefined) present++;
  if (present === written) return text;
  return (canonicalize(record) as string).slice(0, -1);
}

/** Where a chain breaks: the stream sequence and what is wrong there. */
export interface BrokenLink {
  seq: number;
  reason: string;
}

/**
 * Checks a chain event by event, in stream order. The first event checked is taken as it is
 * (its `prev` is the anchor) unless {@link ChainVerifier.anchor} named the one before it.
 */
export class ChainVerifier {
  #last: ChainTail | undefined;
  #count = 0;
  constructor(readonly tenant: string) {}

  /** Events that passed. */
  get count(): number {
    return this.#count;
  }

  /** Starts after an event already checked elsewhere (reading from a later point). */
  anchor(tail: ChainTail): void {
    this.#last = tail;
  }

  /** Checks the stored message `data` at stream sequence `seq`; the broken link, if any. */
  check(seq: number, record: unknown): BrokenLink | undefined {
    const r = record as Partial<AuditRecord> | null;
    if (r === null || typeof r !== "object" || typeof r.hash !== "string")
      return { seq, reason: "not an audit event" };
    if (r.hash !== recordHash(r as AuditRecord))
      return { seq, reason: "its content does not match its hash (rewritten)" };
    if (r.seq !== seq)
      return { seq, reason: `it says it is event ${String(r.seq)} (removed or inserted events)` };
    if (r.tenant !== this.tenant)
      return { seq, reason: `it belongs to tenant ${String(r.tenant)}` };
    const last = this.#last;
    if (last !== undefined) {
      if (seq === last.seq + 2) return { seq, reason: `event ${seq - 1} is missing` };
      if (seq !== last.seq + 1)
        return { seq, reason: `events ${last.seq + 1}–${seq - 1} are missing` };
      if (r.prev !== last.hash)
        return { seq, reason: "its previous hash is not the hash of the event before it" };
    }
    this.#last = { seq, hash: r.hash };
    this.#count++;
    return undefined;
  }
}
