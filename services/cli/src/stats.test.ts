import { describe, expect, it } from "vitest";
import type { StatsReply } from "@toolmesh/protocol";
import { quantileMs, summarize } from "./stats.js";
import { renderTenants } from "./stats-command.js";

const histogram = (counts: number[]) => ({
  boundaries: [0.01, 0.1, 1],
  counts,
  sum: 0,
  count: counts.reduce((a, b) => a + b, 0),
});

function reply(instance: string, metrics: StatsReply["metrics"]): StatsReply {
  return { service: "toolmesh-executor", instance, started_at: 0, metrics };
}

describe("quantileMs", () => {
  it("interpolates inside the bucket that holds the rank, in ms", () => {
    // 10 observations: 4 below 10 ms, 6 between 10 and 100 ms.
    expect(quantileMs(histogram([4, 6, 0, 0]), 0.5)).toBeCloseTo(10 + 90 * (1 / 6));
    expect(quantileMs(histogram([4, 6, 0, 0]), 0.99)).toBeCloseTo(10 + 90 * (5.9 / 6));
  });

  it("answers the lower bound for the open last bucket, nothing without observations", () => {
    expect(quantileMs(histogram([0, 0, 0, 2]), 0.5)).toBe(1000);
    expect(quantileMs(histogram([0, 0, 0, 0]), 0.5)).toBeUndefined();
  });
});

describe("summarize", () => {
  it("sums every replica's points per tool and merges their histograms", () => {
    const tool = { "gen_ai.tool.name": "echo" };
    const replicaOf = (ok: number, timeouts: number, counts: number[]) =>
      reply(`host:${ok}`, [
        {
          name: "toolmesh.tool.calls",
          unit: "{call}",
          type: "counter",
          points: [
            { attributes: tool, value: ok },
            { attributes: { ...tool, "error.type": "timeout" }, value: timeouts },
          ],
        },
        {
          name: "toolmesh.tool.executors",
          unit: "{executor}",
          type: "updown",
          points: [{ attributes: tool, value: 1 }],
        },
        {
          name: "toolmesh.tool.call.duration",
          unit: "s",
          type: "histogram",
          points: [{ attributes: tool, histogram: histogram(counts) }],
        },
      ]);
    const stats = summarize(
      [replicaOf(3, 1, [4, 0, 0, 0]), replicaOf(5, 1, [0, 6, 0, 0])],
      ["echo", "idle"],
      (name) => (name === "echo" ? { num_pending: 2, num_ack_pending: 1 } : undefined),
    );
    expect(stats.tools).toEqual([
      {
        tool: "echo",
        calls: { ok: 8, timeout: 2 },
        rejected: {},
        error_rate: 0.2,
        attempts: 0,
        retries: 0,
        timeouts: 0,
        p50_ms: expect.closeTo(10 + 90 * (1 / 6), 5),
        p99_ms: expect.any(Number),
        in_flight: 0,
        queue: { pending: 2, ack_pending: 1 },
        executors: 2,
      },
      expect.objectContaining({ tool: "idle", calls: {}, executors: 0, queue: undefined }),
    ]);
  });
});

describe("tenants", () => {
  it("sums each tenant's in-flight, queued and refused counts over the resolvers", () => {
    const resolverOf = (inFlight: number, refused: number) =>
      reply(`r:${inFlight}`, [
        {
          name: "toolmesh.tenant.in_flight",
          unit: "{call}",
          type: "gauge",
          points: [{ attributes: { "toolmesh.tenant": "acme" }, value: inFlight }],
        },
        {
          name: "toolmesh.tenant.queued",
          unit: "{call}",
          type: "gauge",
          points: [{ attributes: { "toolmesh.tenant": "acme" }, value: 1 }],
        },
        {
          name: "toolmesh.tenant.refused",
          unit: "{call}",
          type: "counter",
          points: [
            {
              attributes: {
                "toolmesh.tenant": "acme",
                "error.type": "quota_exceeded",
                "toolmesh.quota": "max_in_flight",
              },
              value: refused,
            },
          ],
        },
      ]);
    // What the server's stream info lists for the calls stream: calls stored per session subject.
    const stored = {
      "tm.v1.calls.acme.s1": 3,
      "tm.v1.calls.acme.s2": 40,
      "tm.v1.calls.zeta.s1": 7,
    };
    const stats = summarize([resolverOf(2, 5), resolverOf(3, 7)], [], () => undefined, stored);
    expect(stats.tenants).toEqual([
      {
        tenant: "acme",
        in_flight: 5,
        queued: 2,
        refused: { "quota_exceeded:max_in_flight": 12 },
        stored: { calls: 43, sessions: 2, max_session: 40 },
      },
      // A tenant without a quota shows by what it stores.
      {
        tenant: "zeta",
        in_flight: 0,
        queued: 0,
        refused: {},
        stored: { calls: 7, sessions: 1, max_session: 7 },
      },
    ]);
    expect(renderTenants(stats.tenants)).toEqual([
      "TENANT  INFLIGHT  QUEUED       STORED  REFUSED",
      "acme           5       2  43/2 max 40  quota_exceeded:max_in_flight 12",
      "zeta           0       0    7/1 max 7  0",
    ]);
  });
});
