/** Anything with a deadline, epoch ms. */
export interface HasDeadline {
  deadline: number;
}

/**
 * A binary min-heap on `deadline`: the next deadline in O(1), insert and removal of the
 * earliest in O(log n). Entries are not removed from the middle; the deadline keeper skips
 * entries it no longer watches when they come up, and rebuilds the heap when they pile up.
 */
export class DeadlineHeap<T extends HasDeadline> {
  #items: T[] = [];

  /** Entries held, including those their owner no longer watches. */
  get size(): number {
    return this.#items.length;
  }

  /** The entry with the earliest deadline, left in place. */
  peek(): T | undefined {
    return this.#items[0];
  }

  push(item: T): void {
    const items = this.#items;
    items.push(item);
    let i = items.length - 1;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (items[parent]!.deadline <= item.deadline) break;
      items[i] = items[parent]!;
      i = parent;
    }
    items[i] = item;
  }

  /** Removes and returns the entry with the earliest deadline. */
  pop(): T | undefined {
    const items = this.#items;
    const top = items[0];
    const last = items.pop();
    if (top === undefined || last === undefined || items.length === 0) return top;
    let i = 0;
    for (;;) {
      const left = 2 * i + 1;
      if (left >= items.length) break;
      const right = left + 1;
      const child =
        right < items.length && items[right]!.deadline < items[left]!.deadline ? right : left;
      if (items[child]!.deadline >= last.deadline) break;
      items[i] = items[child]!;
      i = child;
    }
    items[i] = last;
    return top;
  }

  /** Replaces the content with `items`, in O(n). */
  rebuild(items: Iterable<T>): void {
    const all = [...items];
    this.#items = [];
    all.sort((a, b) => a.deadline - b.deadline);
    this.#items = all; // a sorted array is a valid heap
  }
}
