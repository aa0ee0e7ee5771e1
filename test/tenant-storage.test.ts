import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { renderAccountConfig } from "@toolmesh/nats";
import { publishError } from "@toolmesh/nats";
import { ErrorCode, createSubjects, encodeJson } from "@toolmesh/protocol";
import type { ToolMessage, WireError } from "@toolmesh/protocol";
import { runCli } from "./helpers/cli.js";
import { killAllServices, startService } from "./helpers/mesh.js";
import { sample, scrapeMetrics } from "./helpers/metrics.js";
import type { ServiceProcess } from "./helpers/mesh.js";
import { startNatsServer, stopAll, type NatsServerHandle } from "./helpers/nats-server.js";
import { accountUsers } from "./helpers/account-users.js";
import { createTestPki, type TestPki } from "./helpers/tls.js";

// Tenant `flood` publishes calls from its own account as fast as the server takes them, into one
// session and then spread over many; tenant `steady` keeps calling. Each tenant's calls are stored
// in its own calls stream (ADR 0048), which holds at most TOOLMESH_MAX_QUEUED_CALLS_PER_TENANT,
// and at most TOOLMESH_MAX_QUEUED_CALLS_PER_SESSION of one session (ADR 0043): the server refuses
// the flood's excess before storing it, `steady` is never refused, and every call of `flood` the
// server took ends in exactly one final message. docs/quotas.md#storage.
//
// Run on both server versions: TOOLMESH_TEST_NATS_SERVER=/opt/nats-server-current/usr/sbin/nats-server.

const subjects = createSubjects();
const START_MS = 120_000;
/** A row of `toolmesh stats --json`'s storage table. */
interface StorageRow {
  stream: string;
  of: string;
  id?: string;
  bytes: number;
  max_bytes: number;
}
/** The part of `toolmesh stats --json` this test reads (MeshStats of the CLI). */
interface MeshStats {
  tenants: { tenant: string; stored: { calls: number; sessions: number; max_session: number } }[];
}

const LIMITS = {
  TOOLMESH_MAX_QUEUED_CALLS: "2000",
  TOOLMESH_MAX_QUEUED_CALLS_PER_SESSION: "100",
  TOOLMESH_MAX_QUEUED_CALLS_PER_TENANT: "300",
  // 300 small calls take far less; ten large ones fill it (ADR 0050).
  TOOLMESH_TENANT_STORE_BYTES: String(1024 * 1024),
};

let pki: TestPki;
let server: NatsServerHandle;
let resolver: ServiceProcess;
let executor: ServiceProcess;
const { exportPasswords, credentials, connectAs, closeAll } = accountUsers(() => ({
  url: server.url,
  pki,
}));

beforeAll(async () => {
  pki = await createTestPki();
  const config = renderAccountConfig({ tenants: ["flood", "steady"] });
  exportPasswords(config);
  server = await startNatsServer({ config: `${config}\n${pki.serverTlsBlock()}\n` });
  const setup = await runCli(["setup", "--tenants", "flood,steady"], {
    ...credentials("setup"),
    ...LIMITS,
  });
  expect(setup.stderr).toBe("");
  const env = (user: string) => ({ ...credentials(user), ...LIMITS });
  [resolver, executor] = await Promise.all([
    startService("resolver", { ...env("resolver"), TOOLMESH_METRICS_PORT: "0" }, START_MS),
    startService("executor", { ...env("executor"), TOOLMESH_TOOLS_DIR: "tools/builtin" }, START_MS),
  ]);
}, 3 * START_MS);

afterAll(async () => {
  await closeAll();
  await killAllServices();
  await server?.stop();
  await stopAll();
});

/** A tenant's frontend: raw publishes of `echo` calls, and the final messages of its sessions. */
async function frontend(tenant: string) {
  const nc = await connectAs(`frontend-${tenant}`, {
    inboxPrefix: subjects.frontendInboxPrefix(tenant),
  });
  const finals = new Map<string, ToolMessage[]>();
  /** Told of every final message, by the waits of `answered`. */
  const waiting = new Set<(id: string) => void>();
  nc.subscribe(subjects.tenantEvents(tenant), {
    callback: (err, msg) => {
      if (err !== null || !msg.subject.includes(".result.")) return;
      const m = msg.json<ToolMessage>();
      finals.set(m.tool_call_id, [...(finals.get(m.tool_call_id) ?? []), m]);
      for (const answer of waiting) answer(m.tool_call_id);
    },
  });
  await nc.flush();
  const js = jetstream(nc);
  /** Publishes one call; resolves with the typed refusal, or undefined when it was stored. */
  const submit = async (
    id: string,
    session = "s1",
    padding = "",
  ): Promise<WireError | undefined> => {
    const request = {
      tool_call: {
        id,
        type: "function",
        function: { name: "echo", arguments: JSON.stringify({ text: `${id}${padding}` }) },
      },
      session_id: session,
      timeout_ms: 60_000,
    };
    try {
      await js.publish(subjects.call({ tenant, session }), encodeJson(request), {
        msgID: id,
      });
      return undefined;
    } catch (err) {
      return publishError(err, "calls").toWire();
    }
  };
  /**
   * Resolves once every call of `ids` has a final message, as the session's events bring them,
   * or after a minute without: the assertions that follow then name the calls left unanswered.
   */
  const answered = (ids: string[]): Promise<void> =>
    new Promise((resolve) => {
      const missing = new Set(ids.filter((id) => !finals.has(id)));
      const done = (): void => {
        clearTimeout(timer);
        waiting.delete(answer);
        resolve();
      };
      const answer = (id: string): void => {
        missing.delete(id);
        if (missing.size === 0) done();
      };
      const timer = setTimeout(done, 60_000);
      waiting.add(answer);
      if (missing.size === 0) done();
    });
  /** Calls echo with `padding` and resolves with its final message. */
  const call = async (id: string, session: string, padding: string): Promise<ToolMessage[]> => {
    const refused = await submit(id, session, padding);
    if (refused !== undefined) throw new Error(`call ${id} refused at publish: ${refused.code}`);
    await answered([id]);
    return finals.get(id) ?? [];
  };
  /** Reads a stored final message back by direct get, as a client catching up does. */
  const readStored = async (session: string, id: string): Promise<ToolMessage | undefined> => {
    const jsm = await jetstreamManager(nc, { checkAPI: false });
    const stored = await jsm.direct
      .getMessage(subjects.streams.sessions, {
        last_by_subj: subjects.result({ tenant, session }, id),
      })
      .catch(() => null);
    return stored === null ? undefined : stored.json<ToolMessage>();
  };
  return { submit, finals, answered, call, readStored };
}

/**
 * Tenant `flood` publishes with 512 calls in flight (or `workers`; each call's text padded with
 * `padding`), into `sessions` sessions in turn, while
 * tenant `steady` submits three rounds of 20 calls once the flood is refused, each round after the
 * last is answered. Returns what each saw; `floodSeen` is `toolmesh stats --tenant flood` read
 * while the flood was refused.
 */
async function floodWhileSteadyCalls(
  sessions: number,
  prefix: string,
  options: { padding?: string; workers?: number } = {},
) {
  const flood = await frontend("flood");
  const steady = await frontend("steady");
  const accepted: string[] = [];
  const refusals = new Map<string, number>();
  let next = 0;
  let flooding = true;
  const worker = async (): Promise<void> => {
    while (flooding) {
      const n = next++;
      const id = `${prefix}-a-${n}`;
      const refusal = await flood.submit(id, `s${n % sessions}`, options.padding);
      if (refusal === undefined) accepted.push(id);
      else {
        const limit = refusal.details?.limit;
        const key = `${refusal.code}:${typeof limit === "string" ? limit : ""}`;
        refusals.set(key, (refusals.get(key) ?? 0) + 1);
      }
    }
  };
  const floodDone = Promise.all(Array.from({ length: options.workers ?? 512 }, () => worker()));

  // Once the flood is being refused, every submission of the steady tenant must be stored at its
  // first publish.
  while (refusals.size === 0 && accepted.length < 20_000) {
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  let floodSeen: MeshStats["tenants"] = [];
  const lookFailures: string[] = [];
  const steadyRefused: WireError[] = [];
  const steadyIds: string[] = [];
  try {
    for (let round = 0; round < 3; round++) {
      const ids = Array.from({ length: 20 }, (_, i) => `${prefix}-b-${round}-${i}`);
      const refused = await Promise.all(ids.map((id) => steady.submit(id)));
      steadyRefused.push(...refused.filter((r) => r !== undefined));
      const stored = ids.filter((_, i) => refused[i] === undefined);
      steadyIds.push(...stored);
      await steady.answered(stored);
      // The operator sees who fills the calls streams, from the server. The resolver drains
      // them as the flood fills them: a sample may catch a moment with nothing stored, so the
      // operator looks again, as `toolmesh top` would.
      // A look the flooded server does not answer in time (exit 2, one line on stderr) is
      // another look.
      for (let look = 0; look < 5 && floodSeen.length === 0; look++) {
        const stats = await runCli(["stats", "--tenant", "flood", "--json"], {
          ...credentials("operator"),
        });
        if (stats.code !== 0) {
          lookFailures.push(stats.stderr.trim());
          continue;
        }
        floodSeen = (JSON.parse(stats.stdout) as MeshStats).tenants;
      }
    }
  } finally {
    flooding = false;
    await floodDone;
  }
  const steadyWrong = steadyIds
    .map((id) => ({ id, finals: steady.finals.get(id) ?? [] }))
    .filter(({ finals }) => finals.length !== 1 || finals[0]?.error !== undefined)
    .map(({ id, finals }) => ({ id, errors: finals.map((m) => m.error?.code ?? "ok") }));
  // Every call of the flood the server stored ends in exactly one final message.
  await flood.answered(accepted);
  const floodUnanswered = accepted.filter((id) => flood.finals.get(id)?.length !== 1);
  return {
    steadyRefused,
    steadyIds,
    steadyWrong,
    floodSeen,
    refusals,
    floodUnanswered,
    lookFailures,
  };
}

describe("one tenant flooding its calls stream", () => {
  it("into one session is refused past the session's share; another tenant's calls are all accepted and answered", async () => {
    const seen = await floodWhileSteadyCalls(1, "one");
    expect(seen.steadyRefused).toEqual([]);
    expect(seen.steadyIds).toHaveLength(60);
    expect(seen.steadyWrong).toEqual([]);

    expect(seen.floodSeen, seen.lookFailures.join("\n")).toHaveLength(1);
    expect(seen.floodSeen[0]?.tenant).toBe("flood");
    expect(seen.floodSeen[0]?.stored.sessions).toBe(1);
    expect(seen.floodSeen[0]?.stored.max_session).toBeGreaterThan(0);
    expect(seen.floodSeen[0]?.stored.max_session).toBeLessThanOrEqual(
      Number(LIMITS.TOOLMESH_MAX_QUEUED_CALLS_PER_SESSION),
    );
    // The flood was refused by the server with the typed error, and nothing else.
    expect([...seen.refusals.keys()]).toEqual([`${ErrorCode.Overloaded}:queued_per_session`]);
    expect(seen.floodUnanswered).toEqual([]);
  }, 120_000);

  it("over many sessions is refused past the tenant's bound; another tenant's calls are all accepted and answered", async () => {
    // 20 sessions of 100 could hold 2 000 calls, the whole mesh's calls stream: the tenant's
    // bound (300) stops the flood first.
    const seen = await floodWhileSteadyCalls(20, "many");
    expect(seen.steadyRefused).toEqual([]);
    expect(seen.steadyIds).toHaveLength(60);
    expect(seen.steadyWrong).toEqual([]);

    expect(seen.floodSeen, seen.lookFailures.join("\n")).toHaveLength(1);
    expect(seen.floodSeen[0]?.stored.sessions).toBeGreaterThan(1);
    expect(seen.floodSeen[0]?.stored.calls).toBeGreaterThan(0);
    expect(seen.floodSeen[0]?.stored.calls).toBeLessThanOrEqual(
      Number(LIMITS.TOOLMESH_MAX_QUEUED_CALLS_PER_TENANT),
    );
    // Refused by its own stream's bound, as `overloaded` the client retries later.
    expect([...seen.refusals.keys()]).toEqual([`${ErrorCode.Overloaded}:queued`]);
    expect(seen.floodUnanswered).toEqual([]);
    // The generated resolver user had every right it used (no owner account in this mesh).
    expect(JSON.stringify(resolver.lines)).not.toMatch(/Permissions Violation/);
  }, 120_000);

  it("with large calls is refused past the tenant's byte bound; another tenant's calls are all accepted and answered", async () => {
    // 64 calls of 100 kB in flight: ten of them fill the tenant's 1 MiB, long before its 300.
    const seen = await floodWhileSteadyCalls(20, "big", {
      padding: "x".repeat(100_000),
      workers: 64,
    });
    expect(seen.steadyRefused).toEqual([]);
    expect(seen.steadyIds).toHaveLength(60);
    expect(seen.steadyWrong).toEqual([]);
    expect(seen.refusals.get(`${ErrorCode.Overloaded}:stored_bytes`)).toBeGreaterThan(0);
    expect([...seen.refusals.keys()]).toEqual([`${ErrorCode.Overloaded}:stored_bytes`]);
    expect(seen.floodUnanswered).toEqual([]);
    // The operator sees the tenant's stream against its bound.
    const stats = await runCli(["stats", "--tenant", "flood", "--json"], credentials("operator"));
    const storage = (
      JSON.parse(stats.stdout) as { storage: { of: string; id?: string; max_bytes: number }[] }
    ).storage;
    expect(storage.find((u) => u.of === "tenant")).toMatchObject({
      id: "flood",
      max_bytes: 1024 * 1024,
    });
  }, 120_000);
});

describe("one tenant storing large results", () => {
  it("is refused quota_exceeded storage at its bound, within its rate and in-flight quota; another tenant's calls succeed and its stored answers stay readable", async () => {
    const steady = await frontend("steady");
    const flood = await frontend("flood");
    const operator = credentials("operator");
    const storedOf = async (tenant: string) => {
      const stats = await runCli(["stats", "--json"], operator);
      const storage = (JSON.parse(stats.stdout) as { storage: StorageRow[] }).storage;
      return storage.find((u) => u.stream === "results" && u.id === tenant);
    };
    // Answers of the steady tenant stored before the flood, read back at the end.
    const kept = Array.from({ length: 5 }, (_, i) => `kept-${i}`);
    for (const id of kept)
      expect((await steady.call(id, "k", "y".repeat(50_000)))[0]?.error).toBeUndefined();
    // A bound of stored results is a whole tenant's, and at least a byte: typed refusals.
    const ofTool = await runCli(
      ["quotas", "set", "flood", "--tool", "echo", "--max-stored-bytes", "5"],
      operator,
    );
    expect(ofTool.code).not.toBe(0);
    expect(ofTool.stdout).toMatch(/invalid_request.*max_stored_bytes applies to a whole tenant/s);
    const zero = await runCli(["quotas", "set", "flood", "--max-stored-bytes", "0"], operator);
    expect(zero.code).not.toBe(0);
    expect(zero.stdout).toMatch(/invalid_request.*max_stored_bytes/s);
    // Whatever the earlier floods stored counts too: the bound is 3 MiB above it.
    const before = (await storedOf("flood"))?.bytes ?? 0;
    const bound = before + 3 * 1024 * 1024;
    const set = await runCli(
      [
        "quotas",
        "set",
        "flood",
        "--max-in-flight",
        "8",
        "--rate",
        "100",
        "--max-stored-bytes",
        String(bound),
      ],
      operator,
    );
    expect(set.stderr).toBe("");
    await resolver.waitForLog(
      (l) => l.msg === "quota applied" && JSON.stringify(l.limits).includes(String(bound)),
    );

    // Three callers, each waiting for its answer: never past max_in_flight 8 nor the rate, and
    // never past the tenant's 1 MiB calls stream (a call's message goes once it is routed).
    const floodFinals: ToolMessage[] = [];
    let storageRefusals = 0;
    let n = 0;
    const floodCaller = async (): Promise<void> => {
      while (storageRefusals < 8 && n < 200) {
        const [final] = await flood.call(`store-a-${n++}`, `s${n % 4}`, "x".repeat(100_000));
        if (final === undefined) throw new Error("a flood call got no final message");
        floodFinals.push(final);
        if (final.error?.details?.limit === "storage") storageRefusals++;
      }
    };
    const steadyWrong: string[] = [];
    let steadyCalls = 0;
    const steadyCaller = async (): Promise<void> => {
      // During the flood and for a round after it is refused.
      let after = 0;
      while (after < 10) {
        if (storageRefusals > 0) after++;
        const id = `store-b-${steadyCalls++}`;
        const [final] = await steady.call(id, "s1", "z".repeat(20_000));
        if (final === undefined || final.error !== undefined)
          steadyWrong.push(`${id}: ${final?.error?.code ?? "no final message"}`);
      }
    };
    await Promise.all([floodCaller(), floodCaller(), floodCaller(), steadyCaller()]);

    const refusals = floodFinals.filter((m) => m.error !== undefined);
    // Refused by its storage bound only: never by its rate or in-flight quota.
    expect(
      new Set(refusals.map((m) => `${m.error?.code}:${String(m.error?.details?.limit)}`)),
    ).toEqual(new Set([`${ErrorCode.QuotaExceeded}:storage`]));
    expect(refusals[0]?.error?.details).toMatchObject({
      quota: "storage",
      max_stored_bytes: bound,
    });
    expect(refusals[0]?.error?.retryable).toBe(true);
    // What an operator alerts on before tenants are refused: stored results against the bound.
    const metrics = await scrapeMetrics(resolver);
    expect(
      sample(metrics, "toolmesh_tenant_stored_bytes", { toolmesh_tenant: "flood" }),
    ).toBeGreaterThanOrEqual(bound);
    expect(
      sample(metrics, "toolmesh_tenant_stored_bytes_limit", { toolmesh_tenant: "flood" }),
    ).toBe(bound);
    // One line that says when to retry and what an operator can do.
    expect(refusals[0]?.error?.message).toMatch(
      /: retry in \d+ min, when its oldest results expire, or have an operator raise the bound \(toolmesh quotas set flood --max-stored-bytes <bytes>\)$/,
    );
    // About 3 MiB of 100 kB answers were stored before the first refusal.
    expect(floodFinals.length - refusals.length).toBeGreaterThanOrEqual(25);
    expect(steadyWrong).toEqual([]);
    expect(steadyCalls).toBeGreaterThanOrEqual(10);
    // The steady tenant's stored answers are all still there.
    for (const id of kept) expect((await steady.readStored("k", id))?.tool_call_id).toBe(id);

    // The operator sees the flood at its bound; past it by at most what was in flight when the
    // bound was reached.
    const seen = await storedOf("flood");
    expect(seen?.max_bytes).toBe(bound);
    expect(seen?.bytes).toBeGreaterThanOrEqual(bound);
    expect(seen?.bytes).toBeLessThan(bound + 12 * 110_000);
    // No service exited, and the resolver used no right it lacks.
    expect(resolver.child.exitCode).toBeNull();
    expect(executor.child.exitCode).toBeNull();
    expect(JSON.stringify(resolver.lines)).not.toMatch(/Permissions Violation/);
  }, 60_000);
});
