import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import type { AuditEventInput } from "@toolmesh/audit";
import type { ResolvedCall } from "@toolmesh/protocol";
import { ATTEMPT_SHOWN_AFTER_MS, AttemptEvents } from "./attempt-events.js";

const call = {
  call_id: "c1",
  session_id: "s1",
  tool: "echo",
  address: { tenant: "t1", session: "s1" },
} as unknown as ResolvedCall;

/** What the attempt records, in order: type, `at` and data. */
function recorder() {
  const events: { tenant: string; type: string; at: number; data: object }[] = [];
  const audit = {
    record: (tenant: string, e: AuditEventInput) => {
      events.push({ tenant, type: e.type, at: e.at, data: e.data });
      return Promise.resolve();
    },
  };
  return { audit, events };
}

const ENDED = { attempt: 1, duration_ms: 20, outcome: "ok" };

describe("AttemptEvents", () => {
  beforeEach(() => {
    vi.useFakeTimers({ now: 1_000_000 });
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  it("records nothing for a brief attempt that ended its call", () => {
    const { audit, events } = recorder();
    const attempt = new AttemptEvents(audit, call, 1);
    vi.advanceTimersByTime(20);
    attempt.ended(ENDED);
    attempt.endedTheCall();
    attempt.settle();
    vi.advanceTimersByTime(5 * ATTEMPT_SHOWN_AFTER_MS);
    expect(events).toEqual([]);
  });

  it("records a brief attempt's start and end when it did not end its call", () => {
    const { audit, events } = recorder();
    const attempt = new AttemptEvents(audit, call, 2);
    vi.advanceTimersByTime(20);
    attempt.ended({ ...ENDED, attempt: 2, outcome: "tool_error" });
    vi.advanceTimersByTime(50);
    attempt.settle();
    attempt.settle();
    expect(events).toEqual([
      { tenant: "t1", type: "attempt.started", at: 1_000_000, data: { attempt: 2 } },
      {
        tenant: "t1",
        type: "attempt.ended",
        at: 1_000_020,
        data: { attempt: 2, duration_ms: 20, outcome: "tool_error" },
      },
    ]);
  });

  it("records a long attempt's start once it has run that long, and its end when it ends", () => {
    const { audit, events } = recorder();
    const attempt = new AttemptEvents(audit, call, 1);
    vi.advanceTimersByTime(ATTEMPT_SHOWN_AFTER_MS - 1);
    expect(events).toEqual([]);
    vi.advanceTimersByTime(1);
    expect(events.map((e) => [e.type, e.at])).toEqual([["attempt.started", 1_000_000]]);
    vi.advanceTimersByTime(500);
    attempt.ended(ENDED);
    attempt.endedTheCall();
    attempt.settle();
    expect(events.map((e) => [e.type, e.at])).toEqual([
      ["attempt.started", 1_000_000],
      ["attempt.ended", 1_000_000 + ATTEMPT_SHOWN_AFTER_MS + 500],
    ]);
  });
});
