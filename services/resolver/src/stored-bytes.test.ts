import { describe, expect, it } from "vitest";
import { storedNow } from "./stored-bytes.js";

const HOUR = 3_600_000;
const DAY = 24 * HOUR;

describe("storedNow", () => {
  it("adds the slots whose results have not all expired, and says when the oldest expires", () => {
    // Hour slots over a day: slot i counts results stored in [i h, i+1 h), expired by i+1 h + 24 h.
    const entry = { slots: { "0": 100, "5": 20, "30": 3 } };
    expect(storedNow(entry, 2 * HOUR, DAY)).toEqual({ bytes: 123, freesInMs: 23 * HOUR });
    // At 25 h slot 0 has expired from both stores; slot 5 goes at 30 h.
    expect(storedNow(entry, 25 * HOUR, DAY)).toEqual({ bytes: 23, freesInMs: 5 * HOUR });
    expect(storedNow(entry, 60 * HOUR, DAY)).toEqual({ bytes: 0, freesInMs: 0 });
  });

  it("never counts a result as expired before the retention has passed since it was stored", () => {
    const windowMs = 10_000; // slots of 417 ms
    const storedAt = 4_999; // in the slot [4 587, 5 004)
    const slot = String(Math.floor(storedAt / Math.ceil(windowMs / 24)));
    const entry = { slots: { [slot]: 7 } };
    expect(storedNow(entry, storedAt + windowMs - 1, windowMs).bytes).toBe(7);
    expect(storedNow(entry, storedAt + windowMs, windowMs).bytes).toBe(7);
  });
});
