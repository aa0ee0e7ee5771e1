export { NatsServerStartError, startNatsServer, stopAll } from "./local-server.js";
export type { NatsServerHandle, StartNatsServerOptions } from "./local-server.js";
export {
  freePort,
  leafConnections,
  startLeafHub,
  startLeafNode,
  startNatsCluster,
  stepDownStreamLeader,
  streamLeader,
  waitForLeafConnections,
  waitForStreamLeader,
} from "./topology.js";
export type {
  LeafHubHandle,
  NatsClusterHandle,
  NatsClusterNode,
  StartNatsClusterOptions,
} from "./topology.js";
