// Integration tests start their own servers (random ports, temp storage) with the product's
// launcher, the one `toolmesh dev` uses; they never touch the shared NATS at 4222.
export { NatsServerStartError, startNatsServer, stopAll } from "@toolmesh/nats-launcher";
export type { NatsServerHandle, StartNatsServerOptions } from "@toolmesh/nats-launcher";
