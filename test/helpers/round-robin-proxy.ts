import { createServer, request } from "node:http";
import type { IncomingMessage, Server, ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

/** An HTTP load balancer with no affinity: each request goes to the next upstream in turn. */
export interface RoundRobinProxy {
  readonly port: number;
  readonly url: string;
  /** Requests sent to each upstream port so far. */
  readonly hits: Map<number, number>;
  /** Upstream ports that are serving a `tools/call` request right now. */
  callsInFlight(): number[];
  close(): Promise<void>;
}

/**
 * Forwards each request to the next of `ports` (127.0.0.1), as a balancer without session
 * affinity does. An upstream that refuses the connection is skipped for that request (a passive
 * health check), so a dead replica costs no request that had not reached it.
 */
export async function startRoundRobinProxy(ports: readonly number[]): Promise<RoundRobinProxy> {
  let next = 0;
  const hits = new Map<number, number>(ports.map((p) => [p, 0]));
  const calls = new Map<number, number>();

  const forward = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const body = Buffer.concat(chunks);
    const isCall = body.includes("tools/call");
    for (let tried = 0; tried < ports.length; tried++) {
      const port = ports[next++ % ports.length] as number;
      const sent = await new Promise<boolean>((resolve) => {
        // In flight from the moment it reaches the upstream until its answer ends (a JSON answer
        // has no headers before it is whole).
        let counted = false;
        const done = (): void => {
          if (counted) calls.set(port, (calls.get(port) ?? 1) - 1);
          counted = false;
        };
        const upstream = request(
          { host: "127.0.0.1", port, method: req.method, path: req.url, headers: req.headers },
          (answer) => {
            hits.set(port, (hits.get(port) ?? 0) + 1);
            res.writeHead(answer.statusCode ?? 502, answer.headers);
            answer.pipe(res);
            answer.once("close", done);
            answer.once("error", () => res.destroy());
            resolve(true);
          },
        );
        upstream.once("socket", (socket) => {
          const started = (): void => {
            if (!isCall) return;
            counted = true;
            calls.set(port, (calls.get(port) ?? 0) + 1);
          };
          if (socket.connecting) socket.once("connect", started);
          else started();
        });
        upstream.once("close", () => {
          if (!res.headersSent) done();
        });
        upstream.once("error", (err: NodeJS.ErrnoException) => {
          done();
          if (err.code === "ECONNREFUSED" && !res.headersSent) resolve(false);
          else {
            res.destroy();
            resolve(true);
          }
        });
        res.once("close", () => upstream.destroy());
        upstream.end(body);
      });
      if (sent) return;
    }
    res.writeHead(502).end();
  };

  const server: Server = createServer((req, res) => {
    void forward(req, res).catch(() => res.destroy());
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    port,
    url: `http://127.0.0.1:${port}/mcp`,
    hits,
    callsInFlight: () => [...calls].filter(([, n]) => n > 0).map(([p]) => p),
    async close() {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}
