import type {
  AuthInfo,
  JSONRPCMessage,
  JSONRPCNotification,
  JSONRPCRequest,
  RequestId,
  Transport,
  TransportSendOptions,
} from "@modelcontextprotocol/server";

/** Where the server's messages about one client request go: the HTTP exchange that carried it. */
export interface Exchange {
  /** A notification the server sent while serving the request (progress). */
  notify(message: JSONRPCNotification): void;
  /** The server's response, with the client's own request id. */
  answer(message: JSONRPCMessage): void;
}

/**
 * A transport that lets one SDK server serve the requests of every HTTP exchange at once
 * ([ADR 0040](../../../docs/adr/0040-one-mcp-server-per-gateway-process.md)). Each client request
 * gets an id of this process's own (clients' ids collide), and the server's answer goes back to
 * the exchange under the client's id. Nothing outlives the exchange: the transport holds no
 * session, so any replica still answers any request.
 */
export class ExchangeTransport implements Transport {
  onclose?: () => void;
  onerror?: (error: Error) => void;
  onmessage?: Transport["onmessage"];

  #next = 0;
  readonly #pending = new Map<number, { exchange: Exchange; id: RequestId }>();

  start(): Promise<void> {
    return Promise.resolve();
  }

  close(): Promise<void> {
    this.#pending.clear();
    this.onclose?.();
    return Promise.resolve();
  }

  send(message: JSONRPCMessage, options?: TransportSendOptions): Promise<void> {
    if ("id" in message && !("method" in message)) {
      // A response: back to its exchange under the client's id.
      const id = message.id as number;
      const pending = this.#pending.get(id);
      if (pending !== undefined) {
        this.#pending.delete(id);
        pending.exchange.answer({ ...message, id: pending.id });
      }
    } else if ("method" in message && !("id" in message)) {
      const related = options?.relatedRequestId;
      if (related !== undefined) this.#pending.get(related as number)?.exchange.notify(message);
    }
    // The gateway never sends requests to clients (no sampling, no elicitation).
    return Promise.resolve();
  }

  /** Hands a client's request to the server; returns the id it is served under. */
  request(message: JSONRPCRequest, authInfo: AuthInfo, exchange: Exchange): number {
    const id = ++this.#next;
    this.#pending.set(id, { exchange, id: message.id });
    this.onmessage?.({ ...message, id }, { authInfo });
    return id;
  }

  /** Hands a client's notification to the server (never a cancellation: see {@link abandon}). */
  notification(message: JSONRPCNotification): void {
    this.onmessage?.(message);
  }

  /** Whether a request handed over is still being served. */
  serving(id: number): boolean {
    return this.#pending.has(id);
  }

  /** Gives up a request whose client went away: its handler's signal aborts, nothing answers. */
  abandon(id: number): void {
    if (!this.#pending.delete(id)) return;
    this.onmessage?.({
      jsonrpc: "2.0",
      method: "notifications/cancelled",
      params: { requestId: id, reason: "the client went away" },
    });
  }
}
