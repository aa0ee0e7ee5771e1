import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { jetstream } from "@nats-io/jetstream";
import { renderAccountConfig } from "@toolmesh/cli";
import { publishError } from "@toolmesh/nats";
import { ErrorCode, createSubjects, encodeJson } from "@toolmesh/protocol";
import type { ToolMessage, WireError } from "@toolmesh/protocol";
import { runCli } from "./helpers/cli.js";
import { killAllServices, startService } from "./helpers/mesh.js";
import { startNatsServer, stopAll, type NatsServerHandle } from "./helpers/nats-server.js";
import { accountUsers } from "./helpers/account-users.js";
import { createTestPki, type TestPki } from "./helpers/tls.js";

// Tenant `flood` publishes calls from its own account as fast as the server takes them, into one
// session; tenant `steady` keeps calling. The calls stream holds at most 2 000 calls, so without
// the per-session limit the flood fills it and `steady` is refused `overloaded` (run with
// TOOLMESH_MAX_QUEUED_CALLS_PER_SESSION=2000 to see it): with it, the server refuses the flood's
// excess before storing it, `steady` is never refused, and every call of `flood` the server took
// ends in exactly one final message. docs/quotas.md#storage; ADR 0043.
//
// Run on both server versions: TOOLMESH_TEST_NATS_SERVER=/opt/nats-server-current/usr/sbin/nats-server.

const subjects = createSubjects();
const START_MS = 120_000;
/** The part of `toolmesh stats --json` this test reads (MeshStats of the CLI). */
interface MeshStats {
  tenants: { tenant: string; stored: { calls: number; sessions: number; max_session: number } }[];
}

const LIMITS = {
  TOOLMESH_MAX_QUEUED_CALLS: "2000",
  TOOLMESH_MAX_QUEUED_CALLS_PER_SESSION: process.env.TOOLMESH_MAX_QUEUED_CALLS_PER_SESSION ?? "100",
};

let pki: TestPki;
let server: NatsServerHandle;
const { password, credentials, connectAs, closeAll } = accountUsers(() => ({
  url: server.url,
  pki,
}));

beforeAll(async () => {
  pki = await createTestPki();
  const config = renderAccountConfig({ tenants: ["flood", "steady"] });
  for (const m of config.matchAll(/user: "([^"]+)"\n\s+password: \$(\w+)/g)) {
    process.env[m[2]!] = password(m[1]!);
  }
  server = await startNatsServer({ config: `${config}\n${pki.serverTlsBlock()}\n` });
  const setup = await runCli(["setup"], { ...credentials("setup"), ...LIMITS });
  expect(setup.stderr).toBe("");
  const env = (user: string) => ({ ...credentials(user), ...LIMITS });
  await Promise.all([
    startService("resolver", env("resolver"), START_MS),
    startService("executor", { ...env("executor"), TOOLMESH_TOOLS_DIR: "tools/builtin" }, START_MS),
  ]);
}, 3 * START_MS);

afterAll(async () => {
  await closeAll();
  await killAllServices();
  await server?.stop();
  await stopAll();
});

/** A tenant's frontend: raw publishes of `echo` calls, and the final messages of its session. */
async function frontend(tenant: string) {
  const nc = await connectAs(`frontend-${tenant}`, {
    inboxPrefix: subjects.frontendInboxPrefix(tenant),
  });
  const finals = new Map<string, ToolMessage[]>();
  /** Told of every final message, by the waits of `answered`. */
  const waiting = new Set<(id: string) => void>();
  nc.subscribe(subjects.sessionEvents({ tenant, session: "s1" }), {
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
  const submit = async (id: string): Promise<WireError | undefined> => {
    const request = {
      tool_call: {
        id,
        type: "function",
        function: { name: "echo", arguments: JSON.stringify({ text: id }) },
      },
      session_id: "s1",
      timeout_ms: 60_000,
    };
    try {
      await js.publish(subjects.call({ tenant, session: "s1" }), encodeJson(request), {
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
  return { submit, finals, answered };
}

describe("one tenant flooding the calls stream", () => {
  it("is refused before its calls are stored; another tenant's calls are all accepted and answered", async () => {
    const flood = await frontend("flood");
    const steady = await frontend("steady");

    // The flood: 512 publishes in flight at all times until the steady tenant is done.
    const accepted: string[] = [];
    const refusals = new Map<string, number>();
    let next = 0;
    let flooding = true;
    const worker = async (): Promise<void> => {
      while (flooding) {
        const id = `a-${next++}`;
        const refusal = await flood.submit(id);
        if (refusal === undefined) accepted.push(id);
        else {
          const limit = refusal.details?.limit;
          const key = `${refusal.code}:${typeof limit === "string" ? limit : ""}`;
          refusals.set(key, (refusals.get(key) ?? 0) + 1);
        }
      }
    };
    const floodDone = Promise.all(Array.from({ length: 512 }, () => worker()));

    // Once the flood is being refused (its session's share of the stream is full), the steady
    // tenant submits three rounds of 20 calls, each round after the last is answered: every
    // submission must be stored at its first publish.
    while (refusals.size === 0 && accepted.length < 20_000) {
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    let floodSeen: MeshStats["tenants"] = [];
    const steadyRefused: WireError[] = [];
    const steadyIds: string[] = [];
    try {
      for (let round = 0; round < 3; round++) {
        const ids = Array.from({ length: 20 }, (_, i) => `b-${round}-${i}`);
        const refused = await Promise.all(ids.map((id) => steady.submit(id)));
        steadyRefused.push(...refused.filter((r) => r !== undefined));
        const stored = ids.filter((_, i) => refused[i] === undefined);
        steadyIds.push(...stored);
        await steady.answered(stored);
        if (round === 0) {
          // The operator sees who fills the calls stream, from the server: the flood's one
          // session holds its whole share, and no more.
          // The resolver drains the stream as the flood fills it: a sample may catch a moment
          // with nothing stored, so the operator looks again, as `toolmesh top` would.
          for (let look = 0; look < 5 && floodSeen.length === 0; look++) {
            const stats = await runCli(["stats", "--tenant", "flood", "--json"], {
              ...credentials("operator"),
            });
            floodSeen = (JSON.parse(stats.stdout) as MeshStats).tenants;
          }
        }
      }
    } finally {
      flooding = false;
      await floodDone;
    }

    expect(steadyRefused).toEqual([]);
    expect(steadyIds).toHaveLength(60);
    const steadyWrong = steadyIds
      .map((id) => ({ id, finals: steady.finals.get(id) ?? [] }))
      .filter(({ finals }) => finals.length !== 1 || finals[0]?.error !== undefined)
      .map(({ id, finals }) => ({ id, errors: finals.map((m) => m.error?.code ?? "ok") }));
    expect(steadyWrong).toEqual([]);

    expect(floodSeen).toHaveLength(1);
    expect(floodSeen[0]?.tenant).toBe("flood");
    expect(floodSeen[0]?.stored.sessions).toBe(1);
    expect(floodSeen[0]?.stored.max_session).toBeGreaterThan(0);
    expect(floodSeen[0]?.stored.max_session).toBeLessThanOrEqual(
      Number(LIMITS.TOOLMESH_MAX_QUEUED_CALLS_PER_SESSION),
    );

    // The flood was refused by the server with the typed error, and nothing else.
    expect([...refusals.keys()]).toEqual([`${ErrorCode.Overloaded}:queued_per_session`]);

    // Every call of the flood the server stored ends in exactly one final message.
    await flood.answered(accepted);
    expect(accepted.filter((id) => flood.finals.get(id)?.length !== 1)).toEqual([]);
  }, 120_000);
});
