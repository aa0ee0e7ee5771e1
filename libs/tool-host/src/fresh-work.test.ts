import { describe, expect, it } from "vitest";
import { FreshWork } from "./fresh-work.js";
import type { Delivery } from "./fresh-work.js";

const T = 1_000_000;
const young = (overrides: Partial<Delivery> = {}): Delivery => ({
  consumer: "work_a",
  key: "t.s.k",
  seq: 10,
  pending: 3,
  deliveryCount: 1,
  ageMs: 5,
  ...overrides,
});

/** Listening since T, consumer `work_a` drained at sequence 1. */
function ready(): FreshWork {
  const fresh = new FreshWork(2_000);
  fresh.listening(T);
  expect(fresh.trusts(young({ seq: 1, pending: 0 }), T + 1)).toBe(false);
  return fresh;
}

describe("FreshWork", () => {
  it("trusts a young first delivery after the window, once its consumer was drained", () => {
    expect(ready().trusts(young(), T + 2_001)).toBe(true);
  });

  it("does not trust before listening, within the window, or before a drain", () => {
    expect(new FreshWork(2_000).trusts(young({ pending: 0 }), T)).toBe(false);
    expect(ready().trusts(young(), T + 2_000)).toBe(false);
    expect(ready().trusts(young({ consumer: "work_b" }), T + 5_000)).toBe(false);
    expect(ready().trusts(young({ seq: 1 }), T + 5_000)).toBe(false);
  });

  it("does not trust redeliveries, old messages or aborted calls", () => {
    const fresh = ready();
    expect(fresh.trusts(young({ deliveryCount: 2 }), T + 5_000)).toBe(false);
    expect(fresh.trusts(young({ ageMs: 2_000 }), T + 5_000)).toBe(false);
    fresh.aborted("t.s.k", T + 4_000);
    expect(fresh.trusts(young(), T + 5_000)).toBe(false);
    expect(fresh.trusts(young({ key: "t.s.other" }), T + 5_000)).toBe(true);
  });

  it("forgets old aborts, and waits a window before trusting again when it forgets early", () => {
    const fresh = ready();
    fresh.aborted("old", T + 3_000);
    // Ten windows later the entry goes; it was old enough not to matter.
    fresh.aborted("new", T + 3_000 + 20_001);
    expect(fresh.trusts(young({ key: "old" }), T + 23_002)).toBe(true);
    // Too many aborts at once: the oldest are forgotten while still young, so trust waits.
    const busy = ready();
    const at = T + 10_000;
    for (let i = 0; i <= 4_096; i++) busy.aborted(`k${i}`, at);
    expect(busy.trusts(young({ key: "other" }), at + 1_000)).toBe(false);
    expect(busy.trusts(young({ key: "other" }), at + 2_001)).toBe(true);
  });

  it("trusts nothing after a disconnection until a window after reconnecting and a new drain", () => {
    const fresh = ready();
    fresh.disconnected();
    expect(fresh.trusts(young({ seq: 20 }), T + 5_000)).toBe(false);
    fresh.listening(T + 6_000);
    // The first drained delivery after the reconnection marks the consumer again.
    expect(fresh.trusts(young({ seq: 21, pending: 0 }), T + 8_001)).toBe(false);
    expect(fresh.trusts(young({ seq: 22 }), T + 7_999)).toBe(false);
    expect(fresh.trusts(young({ seq: 22 }), T + 8_001)).toBe(true);
    expect(fresh.trusts(young({ seq: 20 }), T + 8_001)).toBe(false);
  });

  it("waits a window and a new drain after a consumer failed", () => {
    const fresh = ready();
    fresh.interrupted(T + 10_000);
    expect(fresh.trusts(young({ seq: 30, pending: 0 }), T + 12_001)).toBe(false);
    expect(fresh.trusts(young({ seq: 31 }), T + 11_000)).toBe(false);
    expect(fresh.trusts(young({ seq: 31 }), T + 12_001)).toBe(true);
  });
});
