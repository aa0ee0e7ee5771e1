import { afterEach, describe, expect, it } from "vitest";
import type { JsMsg } from "@nats-io/jetstream";
import { createLogger } from "@toolmesh/telemetry";
import type { FairShareOptions, HeldCall } from "./fair-share.js";
import { FairShare } from "./fair-share.js";

// The scheduling decisions of fair share, with the tool's work depth and the clock in the test's
// hands: which tenant may take a slot of the window, and which held call goes next.

const log = createLogger({ service: "test", level: "silent" });
const TOOL = "work";
let shares: FairShare[] = [];

afterEach(() => {
  for (const share of shares) share.stop();
  shares = [];
});

/** A fair share over a tool whose outstanding work is what the test says runs. */
function mesh(options: Partial<FairShareOptions> = {}) {
  const running = new Set<string>();
  const dispatched: string[] = [];
  let clock = 1_000_000;
  const share = new FairShare({
    window: 4,
    depth: () => Promise.resolve(running.size),
    weightOf: () => 1,
    now: () => clock,
    log,
    heartbeatMs: 60_000,
    pollMs: 5,
    ...options,
  });
  shares.push(share);
  const id = (tenant: string, n: number) => `${tenant}.s.${n}`;
  return {
    share,
    running,
    dispatched,
    /** Moves the clock on (past the depth's poll interval, so the next look reads it again). */
    advance(ms = 10) {
      clock += ms;
    },
    /** Submits call `n` of `tenant`: started at once, or held; says which. */
    async call(tenant: string, n: number): Promise<"started" | "held"> {
      clock += 10;
      const held = await share.busy(TOOL, tenant);
      const call = heldCall(id(tenant, n), tenant, clock + 60_000, () => {
        running.add(id(tenant, n));
        dispatched.push(id(tenant, n));
      });
      if (held) {
        share.hold(TOOL, call);
        return "held";
      }
      share.started(TOOL, call);
      running.add(call.id);
      return "started";
    },
    /** Call `n` of `tenant` ends: its final message goes by. */
    end(tenant: string, n: number) {
      running.delete(id(tenant, n));
      share.ended(id(tenant, n));
    },
  };
}

function heldCall(id: string, tenant: string, deadlineAt: number, run: () => void): HeldCall {
  const msg = { working() {}, ack() {}, nak() {} } as unknown as JsMsg;
  return {
    id,
    tenant,
    msg,
    deadlineAt,
    dispatch: () => {
      run();
      return Promise.resolve();
    },
    expire: () => Promise.resolve(),
  };
}

/** Resolves once `check` holds, looking every millisecond for at most a second. */
async function until(check: () => boolean): Promise<void> {
  for (let i = 0; i < 1_000 && !check(); i++) await new Promise((r) => setTimeout(r, 1));
  expect(check()).toBe(true);
}

const settle = () => new Promise((r) => setTimeout(r, 50));

describe("a slot of the window kept for a tenant seen recently", () => {
  it("keeps one slot free for a tenant whose call ended within the idle time", async () => {
    const m = mesh({ idleMs: 1_000 });
    expect(await m.call("b", 0)).toBe("started");
    for (let n = 0; n < 3; n++) expect(await m.call("a", n)).toBe("started");
    m.end("b", 0);
    // Three of four slots are taken by A; the fourth stays B's.
    expect(await m.call("a", 3)).toBe("held");
    await settle();
    expect(m.dispatched).toEqual([]);
    // B's next call waits behind A's held one in the queue, and takes the slot at once.
    expect(await m.call("b", 1)).toBe("held");
    await until(() => m.dispatched.length > 0);
    await settle();
    expect(m.dispatched).toEqual(["b.s.1"]);
  });

  it("starts a call at once when nothing is held and its tenant's slot is free", async () => {
    const m = mesh({ idleMs: 1_000 });
    expect(await m.call("b", 0)).toBe("started");
    for (let n = 0; n < 3; n++) expect(await m.call("a", n)).toBe("started");
    m.end("b", 0);
    expect(await m.call("b", 1)).toBe("started");
  });

  it("gives the slot to the busy tenant once the other has been idle for the idle time", async () => {
    const m = mesh({ idleMs: 1_000 });
    expect(await m.call("b", 0)).toBe("started");
    for (let n = 0; n < 3; n++) expect(await m.call("a", n)).toBe("started");
    m.end("b", 0);
    m.advance(1_000);
    expect(await m.call("a", 3)).toBe("started");
  });

  it("keeps as many slots as the tenant lately had calls running and waiting, up to its share", async () => {
    const m = mesh({ idleMs: 1_000 });
    expect(await m.call("b", 0)).toBe("started");
    for (let n = 0; n < 3; n++) expect(await m.call("a", n)).toBe("started");
    expect(await m.call("b", 1)).toBe("held");
    m.end("a", 0);
    await until(() => m.dispatched.length === 1);
    m.end("b", 0);
    m.end("b", 1);
    // B had two calls at once: both slots stay B's (its share of four among two tenants is two).
    expect(await m.call("a", 3)).toBe("held");
    await settle();
    expect(m.dispatched).toEqual(["b.s.1"]);
    expect(await m.call("b", 2)).toBe("held");
    expect(await m.call("b", 3)).toBe("held");
    await until(() => m.dispatched.length === 3);
    await settle();
    expect(m.dispatched).toEqual(["b.s.1", "b.s.2", "b.s.3"]);
  });

  it("keeps no more than the tenant's share of the window", async () => {
    const m = mesh({ idleMs: 1_000 });
    for (let n = 0; n < 4; n++) expect(await m.call("b", n)).toBe("started");
    for (let n = 0; n < 4; n++) m.end("b", n);
    // B had four at once; its share among two tenants is two, so A may run two.
    expect(await m.call("a", 0)).toBe("started");
    expect(await m.call("a", 1)).toBe("started");
    expect(await m.call("a", 2)).toBe("held");
  });

  it("keeps no slot with an idle time of 0", async () => {
    const m = mesh({ idleMs: 0 });
    expect(await m.call("b", 0)).toBe("started");
    for (let n = 0; n < 3; n++) expect(await m.call("a", n)).toBe("started");
    m.end("b", 0);
    expect(await m.call("a", 3)).toBe("started");
  });

  it("keeps a slot per idle tenant, and lets a tenant with nothing running take any free slot", async () => {
    const m = mesh({ idleMs: 1_000 });
    for (const t of ["b", "c"]) {
      expect(await m.call(t, 0)).toBe("started");
      m.end(t, 0);
    }
    expect(await m.call("a", 0)).toBe("started");
    expect(await m.call("a", 1)).toBe("started");
    // Two slots free, both kept for B and C.
    expect(await m.call("a", 2)).toBe("held");
    m.end("a", 2);
  });

  it("lets the busy tenant keep one slot however many tenants are idle", async () => {
    const m = mesh({ window: 2, idleMs: 1_000 });
    for (const t of ["b", "c", "d"]) {
      expect(await m.call(t, 0)).toBe("started");
      m.end(t, 0);
    }
    // Three tenants would keep more than the window: A, with nothing running, still starts one.
    expect(await m.call("a", 0)).toBe("started");
    expect(await m.call("a", 1)).toBe("held");
  });

  it("does not keep a slot for a tenant with a call running", async () => {
    const m = mesh({ idleMs: 1_000 });
    expect(await m.call("b", 0)).toBe("started");
    for (let n = 0; n < 3; n++) expect(await m.call("a", n)).toBe("started");
    // The window is full: B's next call is held like A's.
    expect(await m.call("b", 1)).toBe("held");
    expect(await m.call("a", 3)).toBe("held");
  });
});

describe("held calls handed on as the window frees", () => {
  it("gives a freed slot to the waiting tenant with the fewest calls running", async () => {
    const m = mesh({ idleMs: 10_000 });
    expect(await m.call("b", 0)).toBe("started");
    for (let n = 0; n < 3; n++) expect(await m.call("a", n)).toBe("started");
    expect(await m.call("a", 3)).toBe("held");
    expect(await m.call("b", 1)).toBe("held");
    // A's call ends first: A still runs two, B one, so B's waiting call goes before A's.
    m.end("a", 0);
    await until(() => m.dispatched.length === 1);
    expect(m.dispatched).toEqual(["b.s.1"]);
    m.end("a", 1);
    await until(() => m.dispatched.length === 2);
    expect(m.dispatched).toEqual(["b.s.1", "a.s.3"]);
  });

  it("hands a slot on only once its call's final message went by, even if the server counts it done first", async () => {
    const m = mesh({ window: 1, idleMs: 0 });
    expect(await m.call("a", 0)).toBe("started");
    expect(await m.call("b", 0)).toBe("held");
    // The executor's acknowledgement reached the server before the final message reached us.
    m.running.delete("a.s.0");
    await settle();
    expect(m.dispatched).toEqual([]);
    m.share.ended("a.s.0");
    await until(() => m.dispatched.length === 1);
    expect(m.dispatched).toEqual(["b.s.0"]);
  });

  it("hands a held call on once when the server delivers it again while it waits", async () => {
    const m = mesh({ window: 1, idleMs: 0 });
    expect(await m.call("a", 0)).toBe("started");
    expect(await m.call("b", 0)).toBe("held");
    // Its heartbeats were lost in a server restart: the server delivers the call again, and the
    // resolver holds the new delivery.
    expect(await m.share.busy(TOOL, "b")).toBe(true);
    const again = heldCall("b.s.0", "b", Date.now() + 60_000, () => {
      m.running.add("b.s.0");
      m.dispatched.push("b.s.0 again");
    });
    m.share.hold(TOOL, again);
    expect(m.share.held).toBe(1);
    m.end("a", 0);
    await until(() => m.dispatched.length === 1);
    // The newest delivery goes on, the one the server now waits for.
    expect(m.dispatched).toEqual(["b.s.0 again"]);
    m.end("b", 0);
    await settle();
    expect(m.dispatched).toEqual(["b.s.0 again"]);
    // Its slot is free once it ended: no phantom copy holds it until the call's deadline.
    expect(await m.call("c", 0)).toBe("started");
  });

  it("keeps a delivery held while an earlier delivery of the same call fails to be handed on", async () => {
    const m = mesh({ window: 1, idleMs: 0 });
    expect(await m.call("a", 0)).toBe("started");
    expect(await m.call("b", 0)).toBe("held");
    // b's first delivery, handed on once a's slot frees, fails slowly (the work stream has no
    // leader); meanwhile it is not heartbeated, so the server delivers the call again.
    const acks: string[] = [];
    let fail: (err: Error) => void = () => undefined;
    const first = heldCall("b.s.0", "b", Date.now() + 60_000, () => undefined);
    const failing: HeldCall = {
      ...first,
      msg: { working() {}, ack: () => acks.push("first"), nak() {} } as unknown as JsMsg,
      dispatch: () => new Promise<void>((_, reject) => (fail = reject)),
    };
    m.share.hold(TOOL, failing);
    m.end("a", 0);
    await settle();
    expect(m.share.held).toBe(0);
    const again: HeldCall = {
      ...heldCall("b.s.0", "b", Date.now() + 60_000, () => {
        m.running.add("b.s.0");
        m.dispatched.push("b.s.0 again");
      }),
      msg: { working() {}, ack: () => acks.push("again"), nak() {} } as unknown as JsMsg,
    };
    m.share.hold(TOOL, again);
    fail(new Error("timeout"));
    // The failed delivery gives its slot back; the call has not ended, so the delivery held
    // meanwhile is neither dropped nor acknowledged: it goes on in its turn.
    await until(() => m.dispatched.length === 1);
    expect(m.dispatched).toEqual(["b.s.0 again"]);
    expect(acks).toEqual([]);
  });

  it("shares the slots by weight", async () => {
    const m = mesh({ window: 3, idleMs: 0, weightOf: (t) => (t === "heavy" ? 2 : 1) });
    for (let n = 0; n < 3; n++) expect(await m.call("x", n)).toBe("started");
    for (let n = 0; n < 4; n++) expect(await m.call("light", n)).toBe("held");
    for (let n = 0; n < 4; n++) expect(await m.call("heavy", n)).toBe("held");
    for (let n = 0; n < 3; n++) m.end("x", n);
    await until(() => m.dispatched.length === 3);
    expect(m.dispatched.filter((id) => id.startsWith("heavy"))).toHaveLength(2);
  });

  it("gives a freed slot to the tenant with nothing running, and keeps it for that tenant's next call", async () => {
    const m = mesh({ window: 2, idleMs: 10_000 });
    expect(await m.call("a", 0)).toBe("started");
    expect(await m.call("a", 1)).toBe("started");
    expect(await m.call("a", 2)).toBe("held");
    expect(await m.call("b", 0)).toBe("held");
    expect(await m.call("a", 3)).toBe("held");

    // A's turn comes first in round-robin order, but B has nothing running: the slot is B's.
    m.end("a", 0);
    await until(() => m.dispatched.length === 1);
    expect(m.dispatched).toEqual(["b.s.0"]);

    // B's call ends; its slot waits for B's next call instead of going to A's backlog.
    m.end("b", 0);
    await settle();
    expect(m.dispatched).toEqual(["b.s.0"]);
    expect(await m.call("b", 1)).toBe("held");
    await until(() => m.dispatched.length === 2);
    expect(m.dispatched).toEqual(["b.s.0", "b.s.1"]);

    // A's last running call ends: with nothing running, A takes the free slot.
    m.end("a", 1);
    await until(() => m.dispatched.length === 3);
    expect(m.dispatched).toEqual(["b.s.0", "b.s.1", "a.s.2"]);
  });

  it("counts the calls it let through until they start, so a read of the depth meanwhile lets no more through than the window", async () => {
    const { share, advance } = mesh();
    const held: boolean[] = [];
    // Eight calls arrive while none has started (their quotas and records are being written):
    // the server's depth reads 0 each time.
    for (let n = 0; n < 8; n++) {
      advance();
      held.push(await share.busy(TOOL, "a"));
    }
    expect(held).toEqual([false, false, false, false, true, true, true, true]);
    // Let through long ago and never started (refused, say): no longer counted.
    advance(10_000);
    expect(await share.busy(TOOL, "a")).toBe(false);
  });

  it("keeps counting the calls it let through when a held call is handed on meanwhile", async () => {
    const m = mesh();
    expect(await m.call("a", 0)).toBe("started");
    // Two let through, their quotas and records still being written: not started yet.
    for (let n = 1; n <= 2; n++) {
      m.advance();
      expect(await m.share.busy(TOOL, "a")).toBe(false);
    }
    expect(await m.call("a", 3)).toBe("started");
    expect(await m.call("a", 4)).toBe("held");
    // a.s.0 and a.s.3 end: the held call is handed on, into one of the two free slots.
    m.end("a", 0);
    m.end("a", 3);
    await until(() => m.dispatched.length === 1);
    // The window holds a.s.4 and the two let through: one slot is left, then none.
    m.advance();
    expect(await m.share.busy(TOOL, "a")).toBe(false);
    m.advance();
    expect(await m.share.busy(TOOL, "a")).toBe(true);
  });
});

describe("a window read per tool (its announced capacity)", () => {
  it("holds past the tool's current window, and widens as capacity is announced", async () => {
    let window = 2;
    const m = mesh({ window: () => window, idleMs: 0 });
    expect([await m.call("a", 0), await m.call("a", 1), await m.call("a", 2)]).toEqual([
      "started",
      "started",
      "held",
    ]);
    // A replica added: the held call goes on without any call ending.
    window = 4;
    await until(() => m.dispatched.length === 1);
    expect(await m.call("a", 3)).toBe("started");
    expect(await m.call("a", 4)).toBe("held");
  });

  it("holds nothing for a tool of no announced capacity, and hands held calls on when it drops to 0", async () => {
    let window = 0;
    const m = mesh({ window: () => window, idleMs: 0 });
    expect([await m.call("a", 0), await m.call("a", 1)]).toEqual(["started", "started"]);
    window = 2;
    m.advance();
    expect(await m.call("a", 2)).toBe("held");
    // Every replica gone: the held call goes on to the work stream, as an unheld one would.
    window = 0;
    await until(() => m.dispatched.length === 1);
  });
});

describe("the tool a final message names", () => {
  it("is read only for a call another process started, and only while calls are held", async () => {
    const m = mesh();
    const reads: string[] = [];
    const toolOf = (id: string) => () => {
      reads.push(id);
      return TOOL;
    };
    for (let n = 0; n < 4; n++) expect(await m.call("a", n)).toBe("started");
    // Nothing held: no final message is read.
    m.running.delete("a.s.0");
    m.share.ended("a.s.0", toolOf("a.s.0"));
    m.share.ended("elsewhere.s.0", toolOf("elsewhere.s.0"));
    expect(await m.call("a", 4)).toBe("started");
    expect(await m.call("b", 0)).toBe("held");
    // Held: this process's own call is known without reading its message; another's is read.
    m.running.delete("a.s.1");
    m.share.ended("a.s.1", toolOf("a.s.1"));
    m.share.ended("elsewhere.s.1", toolOf("elsewhere.s.1"));
    expect(reads).toEqual(["elsewhere.s.1"]);
    await until(() => m.dispatched.includes("b.s.0"));
  });
});
