import { createServer } from "node:http";
import type { IncomingMessage, ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import type { ToolmeshClient } from "@toolmesh/client";
import type { ToolMessage } from "@toolmesh/protocol";

/** An HTTP API a test's tools call: its base URL, and a way to stop it. */
export interface HttpApi {
  /** `http://127.0.0.1:{port}`, no trailing slash. */
  readonly url: string;
  close(): Promise<void>;
}

/** Serves `answer` on a free port of 127.0.0.1, each request with its whole body read. */
export async function startHttpApi(
  answer: (req: IncomingMessage, res: ServerResponse, body: string) => void,
): Promise<HttpApi> {
  const server = createServer((req, res) => {
    let body = "";
    req.setEncoding("utf8");
    req.on("data", (chunk: string) => (body += chunk));
    req.on("end", () => answer(req, res, body));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

/** One call in a session of its own, closed afterwards: its final message. */
export async function callOnce(
  client: ToolmeshClient,
  name: string,
  args: Record<string, unknown> = {},
): Promise<ToolMessage> {
  const session = client.session(`s-${name}-${Math.random().toString(36).slice(2)}`);
  try {
    return await session.submit({ name, arguments: args }, { timeoutMs: 20_000 }).result;
  } finally {
    session.close();
  }
}
