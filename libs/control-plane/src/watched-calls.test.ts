import { describe, expect, it } from "vitest";
import { WatchedCalls } from "./watched-calls.js";

describe("WatchedCalls", () => {
  it("hands out due calls earliest first and keeps the rest", () => {
    const calls = new WatchedCalls();
    expect(calls.watch("b", 200, "work.t", 2)).toBe(true);
    expect(calls.watch("a", 100, "work.t", 1)).toBe(true);
    expect(calls.watch("c", 300, "work.u", undefined)).toBe(true);
    expect(calls.nextDeadline()).toBe(100);
    expect(calls.takeDue(250).map((c) => c.key)).toEqual(["a", "b"]);
    expect(calls.size).toBe(1);
    expect(calls.nextDeadline()).toBe(300);
    expect(calls.takeDue(250)).toEqual([]);
  });

  it("forgets a settled call: it is never due and no longer sets the next deadline", () => {
    const calls = new WatchedCalls();
    calls.watch("a", 100, "work.t", 1);
    calls.watch("b", 200, "work.t", 2);
    expect(calls.settle("a")).toBe(true);
    expect(calls.settle("a")).toBe(false);
    expect(calls.nextDeadline()).toBe(200);
    expect(calls.takeDue(1_000).map((c) => c.key)).toEqual(["b"]);
    expect(calls.nextDeadline()).toBeUndefined();
  });

  it("keeps one entry per call: work seen again updates its sequence, not its deadline", () => {
    const calls = new WatchedCalls();
    calls.watch("a", 100, "work.t", 7);
    expect(calls.watch("a", 50, "work.t", undefined)).toBe(false);
    const [due] = calls.takeDue(100);
    expect(due).toMatchObject({ key: "a", deadline: 100, seq: undefined });
  });

  it("after a replay, drops the calls whose work it did not see", () => {
    const calls = new WatchedCalls();
    calls.watch("gone", 100, "work.t", 1);
    calls.watch("kept", 100, "work.t", 2);
    const mark = calls.beginReplay();
    calls.watch("kept", 100, "work.t", 2);
    calls.watch("new", 100, "work.t", 3);
    expect(calls.endReplay(mark).map((c) => c.key)).toEqual(["gone"]);
    expect(calls.has("gone")).toBe(false);
    expect(calls.takeDue(100).map((c) => c.key)).toEqual(expect.arrayContaining(["kept", "new"]));
  });

  it("watches again a dropped call whose work is lost, until its work is seen again", () => {
    const calls = new WatchedCalls();
    calls.watch("lost", 100, "work.t", 1);
    const [lost] = calls.endReplay(calls.beginReplay());
    expect(calls.watchLost(lost!)).toBe(true);
    expect(calls.watchLost(lost!)).toBe(false);
    expect(calls.nextDeadline()).toBe(100);
    calls.watch("lost", 100, "work.t", undefined);
    expect(calls.takeDue(100)).toEqual([expect.objectContaining({ key: "lost", workLost: false })]);
  });

  it("rebuilds its heap when settled calls pile up, keeping the live ones due", () => {
    const calls = new WatchedCalls();
    for (let i = 0; i < 3_000; i++) calls.watch(`k${i}`, 1_000 + i, "work.t", i + 1);
    for (let i = 0; i < 2_999; i++) calls.settle(`k${i}`);
    expect(calls.size).toBe(1);
    expect(calls.nextDeadline()).toBe(3_999);
    expect(calls.takeDue(10_000).map((c) => c.key)).toEqual(["k2999"]);
  });
});
