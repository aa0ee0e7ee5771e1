// Streams and buckets are S2-compressed on nats-server 2.10+ and stored as they are on older
// servers (docs/adr/0044). Run on both: the system's 2.9.10, and 2.15.1 with
// TOOLMESH_TEST_NATS_SERVER=/opt/nats-server-current/usr/sbin/nats-server.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import type { JetStreamManager } from "@nats-io/jetstream";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { createSubjects } from "@toolmesh/protocol";
import type { StreamSpec } from "@toolmesh/nats";
import {
  COMPRESSION_SERVER_VERSION,
  bucketSpec,
  compareVersions,
  ensureStream,
  meshPlan,
  provisionMesh,
} from "@toolmesh/nats";
import { startNatsServer, stopAll, type NatsServerHandle } from "./helpers/nats-server.js";

const subjects = createSubjects({ prefix: "squeeze" });

let server: NatsServerHandle;
let nc: NatsConnection;
let jsm: JetStreamManager;
let compresses: boolean;

beforeAll(async () => {
  server = await startNatsServer();
  nc = await connect({ servers: server.url });
  jsm = await jetstreamManager(nc);
  compresses = compareVersions(nc.info?.version ?? "0.0.0", COMPRESSION_SERVER_VERSION) >= 0;
});

afterAll(async () => {
  await nc?.close();
  await server?.stop();
  await stopAll();
});

function specs(compression: "s2" | "none"): StreamSpec[] {
  const plan = meshPlan(subjects, { compression });
  return [...plan.streams, ...Object.values(plan.buckets)];
}

/** The compression each stream and bucket stream has on the server. */
async function stored(): Promise<(string | undefined)[]> {
  return Promise.all(
    specs("s2").map(async (s) => (await jsm.streams.info(s.config.name)).config.compression),
  );
}

describe("stream compression", () => {
  it("compresses every stream and bucket where the server can, and a second run changes nothing", async () => {
    const first = await provisionMesh(nc, meshPlan(subjects, { compression: "s2" }));
    expect(first.map((c) => c.action)).toEqual(first.map(() => "created"));
    // 2.9 has no compression: nats.js refuses the field, so it is left out there.
    expect(await stored()).toEqual(specs("s2").map(() => (compresses ? "s2" : undefined)));
    const again = await provisionMesh(nc, meshPlan(subjects, { compression: "s2" }));
    expect(again.filter((c) => c.action !== "unchanged")).toEqual([]);
  });

  it("turns compression off in place, keeping the stored messages, naming the setting", async () => {
    const js = jetstream(nc);
    await js.publish(subjects.result({ tenant: "t", session: "s" }, "c1"), "kept");
    const off = await provisionMesh(nc, meshPlan(subjects, { compression: "none" }));
    const updated = off.filter((c) => c.action === "updated");
    if (compresses) {
      expect(updated).toHaveLength(specs("none").length);
      for (const change of updated)
        expect(change.changes).toEqual([
          { field: "compression", setting: "TOOLMESH_STREAM_COMPRESSION", from: "s2", to: "none" },
        ]);
      expect(await stored()).toEqual(specs("none").map(() => "none"));
    } else {
      expect(updated).toEqual([]);
    }
    const info = await jsm.streams.info(subjects.streams.sessions);
    expect(info.state.messages).toBe(1);
    expect(
      (await provisionMesh(nc, meshPlan(subjects, { compression: "none" }))).filter(
        (c) => c.action !== "unchanged",
      ),
    ).toEqual([]);
    // Back on: the way an operator returns to the default.
    const on = await provisionMesh(nc, meshPlan(subjects, { compression: "s2" }));
    expect(on.filter((c) => c.action === "updated")).toHaveLength(
      compresses ? specs("s2").length : 0,
    );
  });

  it("leaves a bucket's compression alone when the opener names none", async () => {
    const spec = bucketSpec(subjects.callsBucket, {});
    const change = await ensureStream(jsm, {
      ...spec,
      config: { ...spec.config, max_age: meshPlan(subjects).buckets.calls.config.max_age },
    });
    expect(change.action).toBe("unchanged");
    expect((await jsm.streams.info(spec.config.name)).config.compression).toBe(
      compresses ? "s2" : undefined,
    );
  });
});
