import { cpSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { NatsServerHandle } from "./nats-server.js";

/** Where nats-server keeps a stream's messages (global account). */
function messagesDir(server: NatsServerHandle, stream: string): string {
  return join(server.storeDir, "jetstream", "$G", "streams", stream, "msgs");
}

/**
 * Leaves the given streams as a killed nats-server 2.9 can leave a work queue: messages its
 * consumers acknowledged (and the stream removed) are back in the stream, below the consumers'
 * ack floors, where they are never delivered again. `settle` acknowledges them; the stream
 * files from before it are put back under the consumer state from after it. Every connection
 * to the server must be closed around the call (the server restarts three times).
 */
export async function leaveOrphans(
  server: NatsServerHandle,
  streams: readonly string[],
  settle: () => Promise<void>,
): Promise<void> {
  const snapshot = mkdtempSync(join(tmpdir(), "toolmesh-orphans-"));
  try {
    await server.restart(); // a clean stop writes everything down
    for (const stream of streams) {
      cpSync(messagesDir(server, stream), join(snapshot, stream), { recursive: true });
    }
    await settle();
    await server.restart(); // the acknowledgements and removals written down
    await server.kill(); // nothing happened since the restart: the store stays as it is
    for (const stream of streams) {
      rmSync(messagesDir(server, stream), { recursive: true, force: true });
      cpSync(join(snapshot, stream), messagesDir(server, stream), { recursive: true });
    }
    await server.restart();
  } finally {
    rmSync(snapshot, { recursive: true, force: true });
  }
}
