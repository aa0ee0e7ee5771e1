import { describe, expect, it } from "vitest";
import { DeadlineHeap } from "./deadline-heap.js";

describe("DeadlineHeap", () => {
  it("gives entries back earliest deadline first", () => {
    const heap = new DeadlineHeap<{ deadline: number; id: number }>();
    const deadlines = [50, 10, 40, 10, 30, 20, 60, 0, 25];
    deadlines.forEach((deadline, id) => heap.push({ deadline, id }));
    expect(heap.size).toBe(deadlines.length);
    expect(heap.peek()?.deadline).toBe(0);
    const out: number[] = [];
    for (let e = heap.pop(); e !== undefined; e = heap.pop()) out.push(e.deadline);
    expect(out).toEqual([...deadlines].sort((a, b) => a - b));
    expect(heap.pop()).toBeUndefined();
  });

  it("keeps its order with pushes between pops, and after a rebuild", () => {
    const heap = new DeadlineHeap<{ deadline: number }>();
    let seed = 7;
    const random = () => (seed = (seed * 48271) % 2147483647) % 1000;
    for (let round = 0; round < 50; round++) {
      for (let i = 0; i < 20; i++) heap.push({ deadline: random() });
      for (let i = 0; i < 5; i++) {
        const popped = heap.pop()!.deadline;
        expect(heap.peek()!.deadline).toBeGreaterThanOrEqual(popped);
      }
    }
    const rest: { deadline: number }[] = [];
    for (let e = heap.pop(); e !== undefined; e = heap.pop()) rest.push(e);
    expect(rest.map((e) => e.deadline)).toEqual(rest.map((e) => e.deadline).sort((a, b) => a - b));
    heap.rebuild([...rest].reverse());
    const again: number[] = [];
    for (let e = heap.pop(); e !== undefined; e = heap.pop()) again.push(e.deadline);
    expect(again).toEqual(rest.map((e) => e.deadline));
  });
});
