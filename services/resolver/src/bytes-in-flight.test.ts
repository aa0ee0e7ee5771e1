import { afterEach, describe, expect, it } from "vitest";
import type { JsMsg } from "@nats-io/jetstream";
import { createLogger } from "@toolmesh/telemetry";
import { BytesInFlight } from "./bytes-in-flight.js";
import type { HeldCall } from "./fair-share.js";
import { FairShare } from "./fair-share.js";

const log = createLogger({ service: "test", level: "silent" });
const KB = 1_024;

describe("BytesInFlight", () => {
  it("weighs a call by its message until its tool's results are known, then by their average", () => {
    const bytes = new BytesInFlight({ maxPerTenant: 1_000 * KB });
    expect(bytes.weigh("a", "echo", 2 * KB)).toBe(2 * KB);
    bytes.started("a.s.1", "a", "echo", 2 * KB, 60_000);
    bytes.ended("a.s.1", 400 * KB);
    expect(bytes.weigh("a", "echo", 2 * KB)).toBe(402 * KB);
    bytes.started("a.s.2", "a", "echo", 402 * KB, 60_000);
    bytes.ended("a.s.2", 0);
    // A running average: the newest result weighs a quarter.
    expect(bytes.weigh("a", "echo", 0)).toBe(300 * KB);
    // Per tenant and tool: no one else's estimate moved.
    expect(bytes.weigh("b", "echo", 10)).toBe(10);
    expect(bytes.weigh("a", "other", 10)).toBe(10);
  });

  it("holds a tenant at its bound until its bytes come down, and no one else", () => {
    const bytes = new BytesInFlight({ maxPerTenant: 1_000 });
    // A tenant with nothing in flight may always start, even a call over the bound.
    expect(bytes.holds("a")).toBe(false);
    bytes.started("a.s.1", "a", "t", 1_500, 60_000);
    expect(bytes.holds("a")).toBe(true);
    expect(bytes.holds("b")).toBe(false);
    expect(bytes.inFlight("a")).toBe(1_500);
    bytes.ended("a.s.1");
    expect(bytes.holds("a")).toBe(false);
    expect(bytes.inFlight("a")).toBe(0);

    bytes.started("a.s.2", "a", "t", 600, 60_000);
    expect(bytes.holds("a")).toBe(false);
    bytes.started("a.s.3", "a", "t", 400, 60_000);
    expect(bytes.holds("a")).toBe(true);
    bytes.ended("a.s.2");
    expect(bytes.holds("a")).toBe(false);
  });

  it("counts a call once, however often it is told, and forgets calls it does not follow", () => {
    const bytes = new BytesInFlight({ maxPerTenant: 1_000 });
    bytes.started("a.s.1", "a", "t", 700, 60_000);
    bytes.started("a.s.1", "a", "t", 700, 60_000);
    expect(bytes.inFlight("a")).toBe(700);
    bytes.ended("a.s.unknown", 5);
    expect(bytes.inFlight("a")).toBe(700);
    bytes.ended("a.s.1");
    bytes.ended("a.s.1");
    expect(bytes.inFlight("a")).toBe(0);
    expect(bytes.calls).toBe(0);
    bytes.started("a.s.2", "a", "t", 2_000, 60_000);
    // Past its deadline its final message was missed: a sweep forgets it.
    bytes.sweep(59_999);
    expect(bytes.holds("a")).toBe(true);
    bytes.sweep(60_001);
    expect(bytes.holds("a")).toBe(false);
    bytes.started("a.s.3", "a", "t", 2_000, 60_000);
    bytes.clear();
    expect(bytes.holds("a")).toBe(false);
  });

  it("keeps at most its number of averages, forgetting the least recently taught", () => {
    const bytes = new BytesInFlight({ maxPerTenant: 1_000, maxAverages: 2 });
    for (const tool of ["x", "y", "x", "z"]) {
      bytes.started(`a.s.${tool}`, "a", tool, 0, 60_000);
      bytes.ended(`a.s.${tool}`, 100);
    }
    expect(bytes.weigh("a", "x", 0)).toBe(100);
    expect(bytes.weigh("a", "z", 0)).toBe(100);
    expect(bytes.weigh("a", "y", 0)).toBe(0);
  });

  it("refuses a bound that is not positive", () => {
    expect(() => new BytesInFlight({ maxPerTenant: 0 })).toThrow(RangeError);
  });
});

// The gate on fair share's hold path: a tenant at its bound waits whatever the tool's window, is
// handed on as its bytes come down, and keeps its deadline; other tenants go by.
describe("fair share with a bytes-in-flight gate", () => {
  let shares: FairShare[] = [];
  afterEach(() => {
    for (const share of shares) share.stop();
    shares = [];
  });

  function gated(window: number) {
    let clock = 1_000_000;
    const bytes = new BytesInFlight({ maxPerTenant: 1_000 });
    const share = new FairShare({
      window,
      depth: () => Promise.resolve(0),
      weightOf: () => 1,
      now: () => clock,
      log,
      heartbeatMs: 60_000,
      pollMs: 5,
      gate: bytes,
    });
    shares.push(share);
    const dispatched: string[] = [];
    const expired: string[] = [];
    const call = (tenant: string, n: number, weight: number, deadlineIn = 60_000): HeldCall => {
      const id = `${tenant}.s.${n}`;
      const msg = { working() {}, ack() {}, nak() {} } as unknown as JsMsg;
      return {
        id,
        tenant,
        msg,
        deadlineAt: clock + deadlineIn,
        bytes: weight,
        dispatch: () => {
          dispatched.push(id);
          return Promise.resolve();
        },
        expire: () => {
          expired.push(id);
          return Promise.resolve();
        },
      };
    };
    /** Submits a call: started at once, or held; says which. */
    const submit = async (c: HeldCall): Promise<"started" | "held"> => {
      if (
        await share.busy("echo", c.tenant, {
          id: c.id,
          bytes: c.bytes ?? 0,
          deadlineAt: c.deadlineAt,
        })
      ) {
        share.hold("echo", c);
        return "held";
      }
      share.started("echo", c);
      return "started";
    };
    return {
      bytes,
      share,
      dispatched,
      expired,
      call,
      submit,
      advance: (ms: number) => (clock += ms),
    };
  }

  async function until(check: () => boolean): Promise<void> {
    for (let i = 0; i < 1_000 && !check(); i++) await new Promise((r) => setTimeout(r, 1));
    expect(check()).toBe(true);
  }

  it("holds a tenant over its bytes while another tenant's calls start at once", async () => {
    // Window 0: the tool itself is never busy; only the gate holds.
    const m = gated(0);
    expect(await m.submit(m.call("a", 1, 600))).toBe("started");
    expect(await m.submit(m.call("a", 2, 600))).toBe("started");
    expect(await m.submit(m.call("a", 3, 600))).toBe("held");
    expect(await m.submit(m.call("a", 4, 600))).toBe("held");
    // B is not behind A's held calls.
    for (let n = 1; n <= 3; n++) expect(await m.submit(m.call("b", n, 10))).toBe("started");
    expect(m.share.held).toBe(2);

    // A's first call ends: its bytes come down to 600, so one held call goes on, and A is at
    // its bound again.
    m.share.ended("a.s.1", () => "echo", 900);
    await until(() => m.dispatched.length === 1);
    expect(m.dispatched).toEqual(["a.s.3"]);
    expect(m.bytes.inFlight("a")).toBe(1_200);
    m.share.ended("a.s.2", () => "echo", 900);
    m.share.ended("a.s.3", () => "echo", 900);
    await until(() => m.dispatched.length === 2);
    expect(m.dispatched).toEqual(["a.s.3", "a.s.4"]);
    expect(m.share.held).toBe(0);
    expect(m.expired).toEqual([]);
  });

  it("counts a call in its tenant's bytes as it is let through, so calls arriving together cannot all pass", async () => {
    // Window 4: each call waits for a read of the tool's depth before it is let through.
    const m = gated(4);
    const verdicts = await Promise.all([1, 2, 3, 4].map((n) => m.submit(m.call("a", n, 600))));
    expect(verdicts.filter((v) => v === "started")).toHaveLength(2);
    expect(m.bytes.inFlight("a")).toBe(1_200);
  });

  it("answers a held call whose deadline passes while its tenant's bytes stay up", async () => {
    const m = gated(0);
    expect(await m.submit(m.call("a", 1, 2_000))).toBe("started");
    expect(await m.submit(m.call("a", 2, 10, 50))).toBe("held");
    m.advance(200);
    await until(() => m.expired.length === 1);
    expect(m.expired).toEqual(["a.s.2"]);
    expect(m.dispatched).toEqual([]);
    expect(m.share.held).toBe(0);
  });

  it("hands every held call back when stopped, and forgets what was in flight", async () => {
    const m = gated(4);
    const naks: string[] = [];
    const held = m.call("a", 2, 10);
    (held.msg as unknown as { nak: () => void }).nak = () => naks.push(held.id);
    expect(await m.submit(m.call("a", 1, 2_000))).toBe("started");
    expect(await m.submit(held)).toBe("held");
    m.share.stop();
    expect(naks).toEqual(["a.s.2"]);
    expect(m.bytes.inFlight("a")).toBe(0);
  });

  it("forgets the bytes of calls it started after a reconnect", async () => {
    const m = gated(4);
    expect(await m.submit(m.call("a", 1, 2_000))).toBe("started");
    expect(m.bytes.holds("a")).toBe(true);
    m.share.reconnected();
    expect(m.bytes.holds("a")).toBe(false);
    expect(await m.submit(m.call("a", 2, 10))).toBe("started");
  });
});
