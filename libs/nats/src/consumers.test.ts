import { describe, expect, it } from "vitest";
import { handBackDelayMs } from "./consumers.js";

describe("handBackDelayMs", () => {
  it("waits 1 s after the first delivery, doubling with each, at most 10 s", () => {
    expect([1, 2, 3, 4, 5, 6, 20].map(handBackDelayMs)).toEqual([
      1_000, 2_000, 4_000, 8_000, 10_000, 10_000, 10_000,
    ]);
  });

  it("spends a tool's six deliveries over 25 s, longer than a leader election", () => {
    // The work consumer's max_deliver is the tool's attempts (3 by default) and 3 more.
    const waited = [1, 2, 3, 4, 5].reduce((sum, n) => sum + handBackDelayMs(n), 0);
    expect(waited).toBe(25_000);
  });
});
