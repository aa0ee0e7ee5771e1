import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { ToolmeshClient } from "@toolmesh/client";
import type { ToolMessage } from "@toolmesh/protocol";
import { createSubjects } from "@toolmesh/protocol";
import { QuotaStore } from "@toolmesh/catalog";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import type { ServiceProcess } from "./helpers/mesh.js";
import { fixtureTools, killAllServices, startService, toolAvailable } from "./helpers/mesh.js";
import { runCli } from "./helpers/cli.js";
import { until } from "./helpers/eventually.js";

// Three resolvers share the calls: every limit must hold across them, exactly.

let server: NatsServerHandle;
let nc: NatsConnection;
let store: QuotaStore;
let env: Record<string, string>;
const resolvers: ServiceProcess[] = [];

beforeAll(async () => {
  server = await startNatsServer();
  env = {
    NATS_URL: server.url,
    TOOLMESH_TOOLS_DIR: fixtureTools("tools-c"),
    TOOLMESH_QUOTA_RECONCILE_MS: "500",
  };
  for (let i = 0; i < 3; i++) resolvers.push(await startService("resolver", env));
  await startService("executor", { ...env, TOOLMESH_CONCURRENCY: "64" });
  await Promise.all(resolvers.map((r) => toolAvailable(r, "concurrency")));
  nc = await connect({ servers: server.url });
  store = await QuotaStore.open(nc, { subjects: createSubjects() });
}, 60_000);

afterAll(async () => {
  await nc?.close();
  await killAllServices();
  await server?.stop();
});

/** Sets a quota and waits until every running resolver logged that it applies it. */
async function setQuota(
  scope: { tenant: string; tool?: string },
  limits: Parameters<QuotaStore["set"]>[1],
): Promise<void> {
  const before = resolvers.map((r) => r.lines.length);
  const stored = await store.set(scope, limits);
  await Promise.all(
    resolvers
      .filter((r) => r.child.exitCode === null && r.child.signalCode === null)
      .map((r, i) =>
        r.waitForLog(
          (l) =>
            l.msg === "quota applied" &&
            l.quota === stored.key &&
            JSON.stringify(l.limits) === JSON.stringify(stored.quota) &&
            r.lines.indexOf(l) >= (before[i] ?? 0),
        ),
      ),
  );
}

async function flood(
  tenant: string,
  count: number,
  holdMs: number,
  tag: string,
): Promise<ToolMessage[]> {
  const client = new ToolmeshClient(nc, { tenant });
  const session = client.session(`s-${tag}`);
  const results = await session.submitAll(
    Array.from({ length: count }, (_, i) => ({
      id: `${tag}-${i}`,
      name: "concurrency",
      arguments: { hold_ms: holdMs },
    })),
  ).results;
  session.close();
  return results;
}

function codes(results: ToolMessage[]): Record<string, number> {
  const byCode: Record<string, number> = {};
  for (const r of results) {
    const code = r.error?.code ?? "ok";
    byCode[code] = (byCode[code] ?? 0) + 1;
  }
  return byCode;
}

async function waitForUsage(tenant: string, inFlight: number, tool?: string): Promise<void> {
  await until(
    `tenant ${tenant} to count ${inFlight} calls in flight`,
    async () => (await store.usage({ tenant, tool })).in_flight === inFlight,
  );
}

describe("quotas across three resolvers", () => {
  it("merges limits set at once by several writers: a lost compare-and-set reads again", async () => {
    const writers = await Promise.all(
      [0, 1, 2].map(async () => QuotaStore.open(nc, { subjects: createSubjects() })),
    );
    const limits = [{ max_in_flight: 3 }, { daily: 50 }, { weight: 2 }];
    const scopes = Array.from({ length: 10 }, (_, i) => ({ tenant: `cas-${i}` }));
    // Each writer reads the (missing) quota before any of them writes: all but one lose the
    // create, read again and merge their field over the winner's.
    await Promise.all(
      scopes.flatMap((scope) => writers.map((writer, i) => writer.set(scope, limits[i] ?? {}))),
    );
    for (const scope of scopes)
      expect((await store.get(scope))?.quota).toEqual({ max_in_flight: 3, daily: 50, weight: 2 });
  });

  it("admits exactly max_in_flight calls at once and counts them out when they end", async () => {
    await setQuota({ tenant: "inflight" }, { max_in_flight: 3 });
    const results = await flood("inflight", 30, 2_000, "if");
    expect(codes(results)).toEqual({ ok: 3, quota_exceeded: 27 });
    const refused = results.find((r) => r.error !== undefined)?.error;
    expect(refused).toMatchObject({
      code: "quota_exceeded",
      retryable: true,
      details: { quota: "max_in_flight", limit: 3, scope: "inflight" },
    });
    await waitForUsage("inflight", 0);
    expect(codes(await flood("inflight", 3, 10, "if2"))).toEqual({ ok: 3 });
  });

  it("refuses calls over the rate with rate_limited and a retry_after_ms", async () => {
    await setQuota({ tenant: "rated" }, { rate: 0.2, burst: 4 });
    const results = await flood("rated", 16, 10, "rt");
    expect(codes(results)).toEqual({ ok: 4, rate_limited: 12 });
    const refused = results.find((r) => r.error !== undefined)?.error;
    expect(refused?.retryable).toBe(true);
    expect(refused?.details).toMatchObject({ quota: "rate", limit: 0.2, burst: 4 });
    expect(refused?.details?.retry_after_ms).toBeGreaterThan(0);
    expect(refused?.details?.retry_after_ms).toBeLessThanOrEqual(5_000);
  });

  it("refuses calls over the daily budget, not retryable", async () => {
    await setQuota({ tenant: "daily" }, { daily: 5 });
    const results = await flood("daily", 12, 10, "dy");
    expect(codes(results)).toEqual({ ok: 5, quota_exceeded: 7 });
    expect(results.find((r) => r.error !== undefined)?.error).toMatchObject({
      retryable: false,
      details: { quota: "daily", limit: 5 },
    });
  });

  it("limits one tool of a tenant and leaves the tenant's other calls alone", async () => {
    await setQuota({ tenant: "pertool", tool: "concurrency" }, { max_in_flight: 2 });
    const results = await flood("pertool", 10, 1_500, "pt");
    expect(codes(results)).toEqual({ ok: 2, quota_exceeded: 8 });
    expect(results.find((r) => r.error !== undefined)?.error?.details).toMatchObject({
      scope: "pertool.tool.concurrency",
    });
    // Another tenant without a quota is not limited at all.
    expect(codes(await flood("free", 20, 200, "fr"))).toEqual({ ok: 20 });
  });

  it("applies a changed quota at once, without a restart", async () => {
    await setQuota({ tenant: "live" }, { max_in_flight: 1 });
    expect(codes(await flood("live", 6, 1_000, "lv1"))).toEqual({ ok: 1, quota_exceeded: 5 });
    await setQuota({ tenant: "live" }, { max_in_flight: 4 });
    expect(codes(await flood("live", 6, 1_000, "lv2"))).toEqual({ ok: 4, quota_exceeded: 2 });
    await setQuota({ tenant: "live" }, { max_in_flight: null });
    expect(codes(await flood("live", 6, 10, "lv3"))).toEqual({ ok: 6 });
  });

  it("is managed with toolmesh quotas, and toolmesh call says when to retry", async () => {
    const cli = (...args: string[]) => runCli(args, { NATS_URL: server.url });
    const set = await cli(
      "quotas",
      "set",
      "cli-t",
      "--tool",
      "concurrency",
      "--rate",
      "0.01",
      "--burst",
      "1",
    );
    expect(set.code).toBe(0);
    expect(set.stdout.trim()).toBe("tenant cli-t tool concurrency: rate=0.01 burst=1");
    const bad = await cli("quotas", "set", "cli-t", "--max-in-flight", "2.5");
    expect(bad.code).not.toBe(0);
    expect(bad.stderr).toMatch(/--max-in-flight.*whole number/);
    const noRate = await cli("quotas", "set", "cli-t", "--burst", "3");
    expect(noRate.code).toBe(1);
    expect(noRate.stdout.trim()).toBe("invalid_request: invalid quota: burst needs a rate");
    expect((await cli("quotas", "list", "cli-t")).stdout.trim()).toBe(
      "tenant cli-t tool concurrency: rate=0.01 burst=1",
    );
    await Promise.all(
      resolvers.map((r) =>
        r.waitForLog((l) => l.msg === "quota applied" && l.quota === "cli-t.tool.concurrency"),
      ),
    );
    const env = { NATS_URL: server.url, TOOLMESH_TENANT: "cli-t" };
    expect((await runCli(["call", "concurrency", "--args", '{"hold_ms":1}', "-q"], env)).code).toBe(
      0,
    );
    const refused = await runCli(["call", "concurrency", "--args", '{"hold_ms":1}', "-q"], env);
    expect(refused.code).toBe(1);
    expect(refused.stdout).toMatch(
      /^rate_limited: quota cli-t\.tool\.concurrency allows 0\.01 calls per second \(burst 1\) \(retry after \d+ ms\)/,
    );
    const got = JSON.parse(
      (await cli("quotas", "get", "cli-t", "--tool", "concurrency", "--json")).stdout,
    ) as {
      usage: { today: number };
    };
    expect(got.usage.today).toBe(1);
    const daily = await cli("quotas", "set", "cli-t", "--tool", "concurrency", "--daily", "5");
    expect(daily.stdout.trim()).toBe("tenant cli-t tool concurrency: rate=0.01 burst=1 daily=5");
    // `none` removes one limit and keeps the others.
    const noDaily = await cli("quotas", "set", "cli-t", "--tool", "concurrency", "--daily", "none");
    expect(noDaily).toMatchObject({ code: 0, stderr: "" });
    expect(noDaily.stdout.trim()).toBe("tenant cli-t tool concurrency: rate=0.01 burst=1");
    expect((await cli("quotas", "rm", "cli-t", "--tool", "concurrency")).stdout.trim()).toBe(
      "removed",
    );
    const gone = await cli("quotas", "get", "cli-t", "--tool", "concurrency");
    expect(gone.code).toBe(1);
    expect(gone.stdout.trim()).toBe("toolmesh: no quota for that scope");
  });

  it("recovers the counts of a resolver killed mid-flood", async () => {
    await setQuota({ tenant: "killed" }, { max_in_flight: 6 });
    const client = new ToolmeshClient(nc, { tenant: "killed" });
    const session = client.session("s-kill");
    const pending = session.submitAll(
      Array.from({ length: 40 }, (_, i) => ({
        id: `k-${i}`,
        name: "concurrency",
        arguments: { hold_ms: 1_500 },
      })),
    ).results;
    // Once the flood is counted, one resolver dies with the calls it counted.
    await waitForUsage("killed", 6);
    const victim = resolvers.pop();
    await victim?.kill();
    const results = await pending;
    session.close();
    const byCode = codes(results);
    // Calls the dead resolver had taken but not decided come back after their ack wait, when the
    // first six may have ended: more than six can run in all, never more than six at once.
    expect(byCode.ok).toBeGreaterThanOrEqual(6);
    expect((byCode.ok ?? 0) + (byCode.quota_exceeded ?? 0)).toBe(40);
    const seen = results
      .filter((r) => r.error === undefined)
      .map((r) => (JSON.parse(r.content) as { seen: number }).seen);
    expect(Math.max(...seen)).toBeLessThanOrEqual(6);
    // What the dead resolver counted is reconciled from the call records: no leak.
    await waitForUsage("killed", 0);
    expect(codes(await flood("killed", 6, 10, "k2"))).toEqual({ ok: 6 });
  });
});
