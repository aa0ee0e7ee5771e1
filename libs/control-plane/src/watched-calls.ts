import { DeadlineHeap } from "./deadline-heap.js";

/** One call watched: its key, deadline, work subject and (once known) work sequence. */
export interface Watched {
  key: string;
  deadline: number;
  subject: string;
  seq: number | undefined;
  /** The replay that last saw the call's work (or a later one, for work seen live). */
  mark: number;
  /** A read of the stream did not find its work though its record was open: the work is lost. */
  workLost?: boolean;
}

// Stale heap entries (calls that ended) beyond which the heap is rebuilt from the live ones.
const COMPACT_SLACK = 1_024;

/**
 * The calls the deadline keeper watches, by key and by deadline, with no timer or NATS of its
 * own: the keeper feeds it work and results and asks it what is due. Deadlines are epoch ms.
 */
export class WatchedCalls {
  readonly #live = new Map<string, Watched>();
  readonly #workSubjects = new Map<string, string>();
  readonly #heap = new DeadlineHeap<Watched>();
  #generation = 0;

  /** Calls watched now. */
  get size(): number {
    return this.#live.size;
  }

  /** Whether the call is watched. */
  has(key: string): boolean {
    return this.#live.has(key);
  }

  /**
   * Watches a call whose work was seen (`seq` undefined when seen live). Returns whether its
   * deadline is a new entry the keeper's timer must consider.
   */
  watch(key: string, deadline: number, subject: string, seq: number | undefined): boolean {
    const known = this.#live.get(key);
    if (known !== undefined) {
      // Seen live once more (no sequence), the call's work was queued again (ADR 0030) and the
      // sequence read earlier may be gone: its work is looked up when it is due.
      known.seq = seq;
      known.mark = this.#generation;
      known.workLost = false;
      return false;
    }
    // One string per work subject (one per tool), not one per call.
    let shared = this.#workSubjects.get(subject);
    if (shared === undefined) this.#workSubjects.set(subject, (shared = subject));
    const entry: Watched = { key, deadline, subject: shared, seq, mark: this.#generation };
    this.#live.set(key, entry);
    this.#heap.push(entry);
    return true;
  }

  /** Forgets a call that ended; returns whether it was watched. */
  settle(key: string): boolean {
    if (!this.#live.delete(key)) return false;
    if (this.#heap.size > 2 * this.#live.size + COMPACT_SLACK)
      this.#heap.rebuild(this.#live.values());
    return true;
  }

  /** The earliest deadline still watched, dropping entries of calls that ended. */
  nextDeadline(): number | undefined {
    const heap = this.#heap;
    let top = heap.peek();
    while (top !== undefined && this.#live.get(top.key) !== top) {
      heap.pop();
      top = heap.peek();
    }
    return top?.deadline;
  }

  /** Removes and returns the calls whose deadline is at or before `now`. */
  takeDue(now: number): Watched[] {
    const due: Watched[] = [];
    const heap = this.#heap;
    for (let top = heap.peek(); top !== undefined && top.deadline <= now; top = heap.peek()) {
      heap.pop();
      if (this.#live.get(top.key) !== top) continue;
      this.#live.delete(top.key);
      due.push(top);
    }
    return due;
  }

  /** Starts a read of the whole work stream; returns its mark for {@link endReplay}. */
  beginReplay(): number {
    return ++this.#generation;
  }

  /**
   * Ends a read of the work stream: calls watched before whose work it did not find are
   * forgotten and returned (they ended while results were missed, as across a reconnect, or
   * their work was lost); work seen live during the read carries this mark or a later one.
   */
  endReplay(mark: number): Watched[] {
    const left: Watched[] = [];
    for (const entry of this.#live.values()) {
      if (entry.mark >= mark) continue;
      this.#live.delete(entry.key);
      left.push(entry);
    }
    return left;
  }

  /**
   * Watches again a call {@link endReplay} returned whose record is still open: its work is
   * lost, and only its deadline ends it. False when the call is watched anew meanwhile.
   */
  watchLost(entry: Watched): boolean {
    if (this.#live.has(entry.key)) return false;
    entry.workLost = true;
    entry.mark = this.#generation;
    this.#live.set(entry.key, entry);
    this.#heap.push(entry);
    return true;
  }
}
