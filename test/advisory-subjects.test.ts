import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import {
  ensureStream,
  meshPlan,
  ownerAdvisoriesSpec,
  ownerWorkStreamSpec,
  provisionMesh,
} from "@toolmesh/nats";
import { createSubjects } from "@toolmesh/protocol";
import { startNatsServer, stopAll, type NatsServerHandle } from "./helpers/nats-server.js";

// Owners registering their first tools at the same moment through different resolvers each
// add their stream's max-deliveries advisories to the advisories stream (ADR 0041). A stream
// update replaces the subjects, with no compare-and-set: every owner's subject must survive.
const subjects = createSubjects({ prefix: "adv" });
const OWNERS = 8;
const ROUNDS = 3;

let server: NatsServerHandle;
let resolvers: NatsConnection[] = [];

beforeAll(async () => {
  server = await startNatsServer();
  // One connection per owner, as if each went through a resolver of its own.
  resolvers = await Promise.all(
    Array.from({ length: OWNERS }, () => connect({ servers: server.url })),
  );
  await provisionMesh(resolvers[0]!, meshPlan(subjects));
});

afterAll(async () => {
  await Promise.all(resolvers.map((nc) => nc.close()));
  await server?.stop();
  await stopAll();
});

describe("the advisories stream", () => {
  it("keeps every owner's max-deliveries advisories when owners add theirs at the same moment", async () => {
    const jsms = await Promise.all(resolvers.map((nc) => jetstreamManager(nc)));
    const owners: string[] = [];
    for (let round = 0; round < ROUNDS; round++) {
      const batch = jsms.map((_, i) => `o${round}x${i}`);
      owners.push(...batch);
      // As the owner services do: the owner's work stream, then its advisories.
      await Promise.all(
        batch.map(async (owner, i) => {
          const jsm = jsms[i]!;
          await ensureStream(jsm, ownerWorkStreamSpec(subjects, owner));
          await ensureStream(jsm, ownerAdvisoriesSpec(subjects, owner));
        }),
      );
    }
    const info = await jsms[0]!.streams.info(subjects.streams.advisories);
    const missing = owners
      .map((owner) => subjects.maxDeliveriesAdvisory(subjects.workStream(owner)))
      .filter((subject) => !(info.config.subjects ?? []).includes(subject));
    expect(missing).toEqual([]);
    // The mesh's own are kept too.
    expect(info.config.subjects).toEqual(
      expect.arrayContaining(
        [subjects.streams.calls, subjects.streams.work].map((s) =>
          subjects.maxDeliveriesAdvisory(s),
        ),
      ),
    );
  });
});
