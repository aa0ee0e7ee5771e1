import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { connect } from "@nats-io/transport-node";
import {
  startLeafHub,
  startLeafNode,
  startNatsCluster,
  stepDownStreamLeader,
  stopAll,
  waitForLeafConnections,
  waitForStreamLeader,
} from "@toolmesh/nats-launcher";
import { afterAll, describe, expect, it } from "vitest";

afterAll(async () => {
  await stopAll();
});

describe("startNatsCluster", () => {
  it("runs three JetStream nodes that keep a replicated stream through a kill and a step-down", async () => {
    const cluster = await startNatsCluster();
    const nc = await connect({ servers: cluster.urls.split(","), maxReconnectAttempts: -1 });
    try {
      expect(cluster.nodes.map((n) => n.name)).toEqual(["n1", "n2", "n3"]);
      const jsm = await jetstreamManager(nc);
      await jsm.streams.add({ name: "R3", subjects: ["r3.>"], num_replicas: 3 });
      const js = jetstream(nc);
      await js.publish("r3.a", "one");

      const leader = await waitForStreamLeader(nc, "R3");
      await cluster.node(leader).kill();
      const next = await waitForStreamLeader(nc, "R3");
      expect(next).not.toBe(leader);
      await js.publish("r3.a", "two");
      await cluster.node(leader).restart();
      await cluster.waitHealthy();

      const moved = await stepDownStreamLeader(nc, "R3");
      expect(moved.to).not.toBe(moved.from);
      expect((await jsm.streams.info("R3")).state.messages).toBe(2);
    } finally {
      await nc.close();
      await cluster.stop();
    }
  });
});

describe("leaf nodes", () => {
  it("give a client of the leaf the hub's JetStream, again after the leaf restarts", async () => {
    const hub = await startLeafHub();
    const leaf = await startLeafNode(hub.leafnodeUrl);
    const atHub = await connect({ servers: hub.url });
    const atLeaf = await connect({ servers: leaf.url, maxReconnectAttempts: -1 });
    // Interest crosses a new leaf connection a moment after it is up: the first replies may be
    // lost, so publish as a client does, retrying with the same message id.
    const publishFromLeaf = async (data: string) => {
      for (let attempt = 1; ; attempt++) {
        const ack = await jetstream(atLeaf)
          .publish("hub.x", data, { msgID: data, timeout: 1_000 })
          .catch((err: unknown) => {
            if (attempt >= 10) throw err;
            return undefined;
          });
        if (ack !== undefined) return ack;
      }
    };
    try {
      await waitForLeafConnections(hub, 1);
      await (await jetstreamManager(atHub)).streams.add({ name: "HUB", subjects: ["hub.>"] });
      const ack = await publishFromLeaf("from the leaf");
      expect(ack.stream).toBe("HUB");

      const reconnected = (async () => {
        for await (const status of atLeaf.status()) if (status.type === "reconnect") return;
      })();
      await leaf.restart();
      await waitForLeafConnections(hub, 1);
      await reconnected;
      const again = await publishFromLeaf("again");
      expect(again.seq).toBe(2);
    } finally {
      await atHub.close();
      await atLeaf.close();
      await leaf.stop();
      await hub.stop();
    }
  });
});
