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
}
