import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Msg } from "@nats-io/nats-core";
import { headers } from "@nats-io/nats-core";
import { jetstream } from "@nats-io/jetstream";
import { MESH_ACCOUNT, ownerAccount, renderAccountConfig, tenantAccount } from "@toolmesh/nats";
import { Header, callKey, createSubjects, resultMsgId } from "@toolmesh/protocol";
import { runCli } from "./helpers/cli.js";
import { startNatsServer, type NatsServerHandle } from "./helpers/nats-server.js";
import { accountUsers, everyRight } from "./helpers/account-users.js";
import { collect } from "./helpers/collect.js";
import { createTestPki, type TestPki } from "./helpers/tls.js";

// The headers the streams republish for the deadline keepers (ADR 0066) are trusted: a forged
// work head would have a keeper end a call at a deadline of the forger's choosing, a forged
// result head would have it forget a call and admission give back its slot. Every principal
// of the configuration `toolmesh auth config` generates (and one with every right in each
// tenant's and owner's account) publishes forged heads under TLS; only the streams' own reach
// a keeper's subscription. Run on both server versions:
// TOOLMESH_TEST_NATS_SERVER=/opt/nats-server-current/usr/sbin/nats-server.

const subjects = createSubjects();
const address = { tenant: "acme", session: "s1" };

let pki: TestPki;
let server: NatsServerHandle;
let config: string;
const { exportPasswords, credentials, connectAs, closeAll } = accountUsers(() => ({
  url: server.url,
  pki,
}));

beforeAll(async () => {
  pki = await createTestPki();
  config = renderAccountConfig({
    tenants: ["acme"],
    owners: { rogue: [] },
    extraUsers: [
      everyRight(tenantAccount("acme"), "acme-root"),
      everyRight(ownerAccount("rogue"), "rogue-root"),
      // The test's keeper: every right in the mesh account.
      everyRight(MESH_ACCOUNT, "observer"),
    ],
  });
  exportPasswords(config);
  server = await startNatsServer({ config: `${config}\n${pki.serverTlsBlock()}\n` });
  const setup = await runCli(["setup", "--tenants", "acme", "--owners", "rogue"], {
    ...credentials("setup"),
    TOOLMESH_REPUBLISH_HEADS: "on",
  });
  expect(setup.stderr).toBe("");
}, 60_000);

afterAll(async () => {
  await closeAll();
  await server?.stop();
});

describe("the heads the streams republish", () => {
  it("reach a keeper from the streams only: no principal can forge a work or a result head", async () => {
    const keeper = await connectAs("observer");
    const work = collect(keeper, subjects.allWorkHeads);
    const results = collect(keeper, subjects.allResultHeads);
    await keeper.flush();
    const users = [...config.matchAll(/user: "([^"]+)"/g)]
      .map((m) => m[1] as string)
      .filter((user) => user !== "observer");
    expect(users).toEqual(expect.arrayContaining(["resolver", "executor-rogue", "acme-root"]));
    const key = callKey(address, `${address.session}/victim`);
    for (const user of users) {
      const nc = await connectAs(user);
      const forged = headers();
      forged.set(Header.CallKey, key);
      forged.set(Header.Deadline, "1");
      forged.set(Header.MsgId, resultMsgId(key));
      forged.set(Header.RepublishedSubject, subjects.result(address, "victim"));
      for (const subject of [
        `${subjects.allWorkHeads.slice(0, -1)}echo`,
        `${subjects.allWorkHeads.slice(0, -1)}rogue.echo`,
        `${subjects.allResultHeads.slice(0, -1)}acme.s1.victim`,
      ])
        nc.publish(subject, new Uint8Array(), { headers: forged });
      await nc.flush().catch(() => undefined);
    }
    // The streams' own: a work message and a final message stored, their heads republished.
    const js = jetstream(keeper);
    const stored = headers();
    stored.set(Header.CallKey, key);
    stored.set(Header.Deadline, String(Date.now() + 60_000));
    await js.publish(subjects.work("echo"), new TextEncoder().encode('{"big":"body"}'), {
      headers: stored,
    });
    await js.publish(subjects.work("echo", "rogue"), new TextEncoder().encode("{}"), {
      headers: stored,
    });
    await js.publish(subjects.result(address, "victim"), new TextEncoder().encode("{}"), {
      msgID: resultMsgId(key),
    });
    // Each forger's connection was flushed before these were stored: anything it got through
    // reached the keeper before the streams' own heads.
    await expect.poll(() => work.length + results.length, { timeout: 5_000 }).toBe(3);
    const heads = (msgs: Msg[]) =>
      msgs.map((m) => ({
        subject: m.headers?.get(Header.RepublishedSubject),
        bytes: m.data.length,
        size: m.headers?.get(Header.RepublishedSize),
      }));
    expect(heads(work)).toEqual([
      { subject: subjects.work("echo"), bytes: 0, size: "14" },
      { subject: subjects.work("echo", "rogue"), bytes: 0, size: "2" },
    ]);
    expect(work.every((m) => m.headers?.get(Header.Deadline) !== "1")).toBe(true);
    expect(heads(results)).toEqual([
      { subject: subjects.result(address, "victim"), bytes: 0, size: "2" },
    ]);
    expect(results[0]?.headers?.get(Header.MsgId)).toBe(resultMsgId(key));
  });
});
