import type { NatsConnection } from "@nats-io/nats-core";
import type { Subjects } from "@toolmesh/protocol";
import type { MeshCallPlane } from "@toolmesh/call-store";
import type { Logger } from "@toolmesh/telemetry";

/** What the control plane's handlers work with: one connection, the call plane, a logger. */
export interface ControlDeps {
  nc: NatsConnection;
  plane: MeshCallPlane;
  subjects: Subjects;
  log: Logger;
  /**
   * The work stream of a tool's calls as routed now (the mesh's, or its owner's): where its
   * cancellations are broadcast ({@link Subjects.abortOf}). Default the mesh's.
   */
  workStreamOf?: (tool: string) => string;
}
