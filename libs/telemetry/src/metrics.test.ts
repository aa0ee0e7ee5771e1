import { afterEach, describe, expect, it } from "vitest";
import { toolmeshMetrics } from "./instruments.js";
import { initMetrics, type Metrics } from "./metrics.js";

let handle: Metrics | undefined;

afterEach(async () => {
  await handle?.shutdown();
  handle = undefined;
});

describe("metrics", () => {
  it("are off with OTEL_METRICS_EXPORTER=none, and instruments then record nothing", async () => {
    handle = await initMetrics({ serviceName: "t", env: { OTEL_METRICS_EXPORTER: "none" } });
    expect(handle.enabled).toBe(false);
    toolmeshMetrics().callEnded("echo", undefined, 0.1);
    expect(await handle.snapshot()).toEqual([]);
  });

  it("are off with OTEL_SDK_DISABLED=true", async () => {
    handle = await initMetrics({ serviceName: "t", env: { OTEL_SDK_DISABLED: "true" } });
    expect(handle.enabled).toBe(false);
  });

  it("snapshot what the instruments recorded, by tool and error.type", async () => {
    handle = await initMetrics({ serviceName: "t", env: {} });
    const m = toolmeshMetrics();
    m.attemptStarted("echo", 0.02);
    m.attemptEnded("echo", "timeout", true);
    m.attemptStarted("echo");
    m.attemptEnded("echo", undefined, false);
    m.callEnded("echo", undefined, 1.2);
    m.resolved("unknown_tool", undefined);
    m.observeQueues(() => Promise.resolve([{ tool: "echo", pending: 3, ackPending: 1 }]));

    const snapshot = await handle.snapshot();
    const find = (name: string) => snapshot.find((metric) => metric.name === name);
    expect(find("toolmesh.tool.attempts")?.points).toEqual(
      expect.arrayContaining([
        { attributes: { "gen_ai.tool.name": "echo", "error.type": "timeout" }, value: 1 },
        { attributes: { "gen_ai.tool.name": "echo" }, value: 1 },
      ]),
    );
    expect(find("toolmesh.tool.retries")?.points).toEqual([
      { attributes: { "gen_ai.tool.name": "echo", "error.type": "timeout" }, value: 1 },
    ]);
    expect(find("toolmesh.tool.timeouts")?.points[0]?.value).toBe(1);
    expect(find("toolmesh.tool.in_flight")?.points[0]?.value).toBe(0);
    const duration = find("toolmesh.tool.call.duration");
    expect(duration).toMatchObject({ unit: "s", type: "histogram" });
    expect(duration?.points[0]?.histogram).toMatchObject({ count: 1, sum: 1.2 });
    expect(find("toolmesh.resolver.calls")?.points).toEqual([
      {
        attributes: { "toolmesh.resolution": "rejected", "error.type": "unknown_tool" },
        value: 1,
      },
    ]);
    expect(find("toolmesh.tool.queue.pending")?.points).toEqual([
      { attributes: { "gen_ai.tool.name": "echo" }, value: 3 },
    ]);
  });
});
