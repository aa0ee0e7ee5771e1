import { createServer, connect, type Server, type Socket } from "node:net";
import { DeliveryFilter, type Delivered } from "./nats-frames.js";

/** A TCP forwarder whose link can be cut and restored, to drop a connection on purpose. */
export interface TcpProxy {
  /** The local port it listens on; the same after `restore()`. */
  readonly port: number;
  /** Closes every forwarded connection and refuses new ones. */
  cut(): Promise<void>;
  /** Accepts connections again, on the same port. */
  restore(): Promise<void>;
  close(): Promise<void>;
}

/** Options of {@link startTcpProxy}. */
export interface TcpProxyOptions {
  /**
   * Leaves out the server's messages this picks (asked per message, so a test may change its
   * answer): deliveries lost on the way while the connection stays up.
   */
  dropDelivered?: (message: Delivered) => boolean;
}

/** Forwards 127.0.0.1:<random port> to 127.0.0.1:`targetPort`. */
export async function startTcpProxy(
  targetPort: number,
  options: TcpProxyOptions = {},
): Promise<TcpProxy> {
  const sockets = new Set<Socket>();
  const track = (socket: Socket): void => {
    sockets.add(socket);
    socket.once("close", () => sockets.delete(socket));
  };
  const listen = async (port: number): Promise<Server> => {
    const server = createServer((inbound) => {
      const outbound = connect(targetPort, "127.0.0.1");
      track(inbound);
      track(outbound);
      inbound.pipe(outbound);
      const drop = options.dropDelivered;
      if (drop === undefined) outbound.pipe(inbound);
      else outbound.pipe(new DeliveryFilter(drop)).pipe(inbound);
      inbound.on("error", () => outbound.destroy());
      outbound.on("error", () => inbound.destroy());
    });
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(port, "127.0.0.1", resolve);
    });
    return server;
  };
  let server: Server | undefined = await listen(0);
  const address = server.address();
  if (address === null || typeof address === "string") throw new Error("proxy has no port");
  const port = address.port;
  const cut = async (): Promise<void> => {
    const closing = server;
    server = undefined;
    for (const socket of sockets) socket.destroy();
    if (closing !== undefined) await new Promise<void>((resolve) => closing.close(() => resolve()));
  };
  return {
    port,
    cut,
    async restore() {
      server ??= await listen(port);
    },
    close: cut,
  };
}
