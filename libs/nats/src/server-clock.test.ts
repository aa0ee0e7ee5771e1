import { describe, expect, it } from "vitest";
import { ServerClock } from "./server-clock.js";

describe("ServerClock", () => {
  it("takes the smallest delay seen as the offset", () => {
    const clock = new ServerClock();
    clock.observe(1_000, 1_300);
    clock.observe(2_000, 2_050);
    expect(clock.offsetMs).toBe(50);
  });

  it("keeps a fresh sample when a backlog of old messages fills the window", () => {
    const clock = new ServerClock(4);
    const now = Date.now();
    clock.anchor(now - 5, now);
    for (let i = 0; i < 10; i++) clock.observe(now - 2_500, now);
    expect(clock.offsetMs).toBe(5);
  });

  it("tells its listeners when the estimate changes, and only then", () => {
    const clock = new ServerClock();
    let changes = 0;
    const stop = clock.onChange(() => changes++);
    clock.observe(1_000, 3_000);
    clock.observe(1_000, 3_500);
    clock.observe(1_000, 1_010);
    stop();
    clock.observe(1_000, 1_000);
    expect(changes).toBe(2);
  });
});
