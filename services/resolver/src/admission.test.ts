import { afterEach, describe, expect, it, vi } from "vitest";
import type { ResolvedCall } from "@toolmesh/protocol";
import { ErrorCode, subjectToken } from "@toolmesh/protocol";
import { createLogger, toolmeshMetrics } from "@toolmesh/telemetry";
import type { AdmissionCall } from "./admission.js";
import { Admission, admissionId } from "./admission.js";
import { FairShare } from "./fair-share.js";
import { BytesInFlight } from "./bytes-in-flight.js";
import { SessionLimits } from "./session-limits.js";

// Admission's steps and what it gives back, without NATS: the session slot and the fair turn
// (quotas need their buckets; test/quotas.test.ts drives them through real resolvers).

const log = createLogger({ service: "test", level: "silent" });
const address = { tenant: "acme", session: "s1" };
let shares: FairShare[] = [];

afterEach(() => {
  for (const share of shares) share.stop();
  shares = [];
});

function callOf(id: string, seq = 1): AdmissionCall {
  const resolved = {
    call_id: id,
    session_id: address.session,
    address,
    tool: "work",
    idempotency_key: `${address.session}/${id}`,
    deadline_at: Number.MAX_SAFE_INTEGER,
  } as unknown as ResolvedCall;
  return { resolved, request: {} as AdmissionCall["request"], key: `k-${id}`, seq };
}

function fairShare(depth: () => number): FairShare {
  const share = new FairShare({
    window: 1,
    depth: () => Promise.resolve(depth()),
    weightOf: () => 1,
    now: () => 1_000,
    log,
    heartbeatMs: 60_000,
    idleMs: 0,
  });
  shares.push(share);
  return share;
}

describe("Admission", () => {
  it("refuses a session over its limit with overloaded, counted unlabelled, under the delivery's message id", async () => {
    const metrics = toolmeshMetrics();
    const refusals = vi.spyOn(metrics, "tenantRefused");
    const admission = new Admission({ limits: new SessionLimits(1), metrics });
    expect((await admission.admit(callOf("a"), 0)).decision).toBe("go");

    const refused = await admission.admit(callOf("b", 7), 0);
    expect(refused).toMatchObject({ decision: "refuse", msgId: "overloaded:k-b:7", logged: false });
    if (refused.decision !== "refuse") throw new Error("not refused");
    expect(refused.error.code).toBe(ErrorCode.Overloaded);
    expect(refused.error.details).toEqual({ max_in_flight: 1, retry_after_ms: 1_000 });
    expect(refusals.mock.calls).toEqual([
      [undefined, ErrorCode.Overloaded, "session_max_in_flight"],
    ]);
  });

  it("gives the session slot back when a ticket is withdrawn, and when the final message settles the call", async () => {
    const admission = new Admission({ limits: new SessionLimits(1), metrics: toolmeshMetrics() });
    const first = await admission.admit(callOf("a"), 0);
    if (first.decision === "refuse") throw first.error;
    await first.ticket.withdraw();
    const second = await admission.admit(callOf("b"), 0);
    expect(second.decision).toBe("go");

    admission.settle(address, subjectToken("b"), () => undefined);
    expect((await admission.admit(callOf("c"), 0)).decision).toBe("go");
  });

  it("holds a call at a busy tool and starts it at its turn, counted by its admission id", async () => {
    let outstanding = 1;
    const share = fairShare(() => outstanding);
    const admission = new Admission({
      limits: new SessionLimits(10),
      fairShare: share,
      metrics: toolmeshMetrics(),
    });
    const verdict = await admission.admit(callOf("a"), 0);
    if (verdict.decision === "refuse") throw verdict.error;
    expect(verdict.decision).toBe("hold");
    expect(verdict.ticket.id).toBe(admissionId(address, subjectToken("a")));

    const dispatched = new Promise<void>((resolve) => {
      verdict.ticket.hold(
        { working: () => undefined } as unknown as Parameters<typeof verdict.ticket.hold>[0],
        () => {
          resolve();
          return Promise.resolve();
        },
        () => Promise.reject(new Error("the call expired instead of being dispatched")),
      );
    });
    expect(share.held).toBe(1);
    outstanding = 0;
    share.ended("someone-else", () => "work");
    await dispatched;
    expect(share.held).toBe(0);
  });

  it("refuses to hold a call when no fair share runs", async () => {
    const admission = new Admission({ limits: new SessionLimits(10), metrics: toolmeshMetrics() });
    const verdict = await admission.admit(callOf("a"), 0);
    if (verdict.decision === "refuse") throw verdict.error;
    expect(() =>
      verdict.ticket.hold(
        {} as Parameters<typeof verdict.ticket.hold>[0],
        () => Promise.resolve(),
        () => Promise.resolve(),
      ),
    ).toThrow("only a fair-share turn holds a call");
  });

  it("weighs a call let through in its tenant's bytes, gives them back when it is withdrawn, and holds a tenant at its bound", async () => {
    const bytesInFlight = new BytesInFlight({ maxPerTenant: 1_000 });
    const share = new FairShare({
      window: 0,
      depth: () => Promise.resolve(0),
      weightOf: () => 1,
      now: () => 1_000,
      log,
      heartbeatMs: 60_000,
      gate: bytesInFlight,
    });
    shares.push(share);
    const admission = new Admission({
      limits: new SessionLimits(10),
      fairShare: share,
      bytesInFlight,
      metrics: toolmeshMetrics(),
    });
    const withBytes = (id: string) => ({ ...callOf(id), messageBytes: 200 });
    const first = await admission.admit(withBytes("a"), 0);
    expect(first.decision).toBe("go");
    expect(bytesInFlight.inFlight("acme")).toBe(200);
    admission.settle(address, subjectToken("a"), () => "work", 400);
    // The first call's final message: 400 bytes, which its tool's next calls are weighed by.
    expect(bytesInFlight.inFlight("acme")).toBe(0);
    const first2 = await admission.admit(withBytes("a2"), 0);
    expect(first2.decision).toBe("go");
    expect(bytesInFlight.inFlight("acme")).toBe(600);
    const second = await admission.admit(withBytes("b"), 0);
    expect(second.decision).toBe("go");
    expect((await admission.admit(withBytes("c"), 0)).decision).toBe("hold");
    if (second.decision === "refuse") throw second.error;
    await second.ticket.withdraw();
    expect(bytesInFlight.inFlight("acme")).toBe(600);
    admission.settle(address, subjectToken("a2"), () => "work", 0);
    expect(bytesInFlight.inFlight("acme")).toBe(0);
    // A running average: 400, then 0 weighing a quarter.
    expect(admission.weigh(withBytes("d"))).toBe(500);
  });
});
