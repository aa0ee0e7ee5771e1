import { describe, expect, it } from "vitest";
import { ConnectionWatch } from "./connection-watch.js";

describe("ConnectionWatch", () => {
  it("stays alive through a drop shorter than the bound and dies past it", () => {
    let now = 1_000;
    const watch = new ConnectionWatch(5_000, () => now);
    expect(watch.connected()).toBe(true);
    watch.disconnected();
    now += 4_000;
    watch.disconnected(); // a second drop while down keeps the first time
    expect(watch.connected()).toBe(false);
    expect(watch.downForMs()).toBe(4_000);
    expect(watch.alive()).toBe(true);
    now += 1_001;
    expect(watch.alive()).toBe(false);
    watch.reconnected();
    expect(watch.alive()).toBe(true);
    expect(watch.downForMs()).toBe(0);
  });
});
