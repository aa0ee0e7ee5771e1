import { describe, expect, it } from "vitest";
import { parseDurationMs, settledWithin } from "./durations.js";

describe("parseDurationMs", () => {
  it("reads a whole number and a unit, and nothing else", () => {
    expect(parseDurationMs("250ms")).toBe(250);
    expect(parseDurationMs(" 90s ")).toBe(90_000);
    expect(parseDurationMs("2h")).toBe(7_200_000);
    expect(parseDurationMs("1.5s")).toBeUndefined();
    expect(parseDurationMs("90")).toBeUndefined();
  });
});

describe("settledWithin", () => {
  it("is true when the promise fulfils within the bound", async () => {
    expect(await settledWithin(Promise.resolve("x"), 1_000)).toBe(true);
  });

  it("is false when the bound comes first", async () => {
    const never = new Promise<void>(() => undefined);
    expect(await settledWithin(never, 5)).toBe(false);
  });

  it("rejects with the promise's error when it rejects within the bound", async () => {
    await expect(settledWithin(Promise.reject(new Error("boom")), 1_000)).rejects.toThrow("boom");
  });
});
