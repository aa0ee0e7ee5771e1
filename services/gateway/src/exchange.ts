import type { ServerResponse } from "node:http";
import type { JSONRPCMessage, JSONRPCRequest, RequestId } from "@modelcontextprotocol/server";
import type { Span } from "@opentelemetry/api";
import { sendJson, sseEvent } from "./http-util.js";
import type { Exchange } from "./transport.js";

/**
 * One HTTP exchange of the 2025-era leg: it owns the answers to the requests of one POST (a
 * JSON body, or an event stream when a request asks for progress), the request's span and its
 * admission, all released in {@link end} exactly once however the exchange ends (every answer
 * written, or the client gone).
 */
export class LegacyExchange implements Exchange {
  readonly #answers = new Map<RequestId, JSONRPCMessage>();
  readonly #served: number[] = [];
  #ended = false;
  #span: Span | undefined;

  constructor(
    private readonly res: ServerResponse,
    private readonly requests: JSONRPCRequest[],
    private readonly batch: boolean,
    private readonly events: boolean,
    /** Releases what the exchange holds (its admission, its served requests). */
    private readonly release: (served: readonly number[]) => void,
  ) {
    res.on("close", () => this.end());
    if (events) {
      res.writeHead(200, {
        "content-type": "text/event-stream",
        "cache-control": "no-cache, no-transform",
        connection: "keep-alive",
      });
      res.flushHeaders();
    }
  }

  /** The span the exchange ends with. */
  bind(span: Span): void {
    this.#span = span;
  }

  /** Remembers a request handed to the server under the id it is served with. */
  serving(id: number): void {
    this.#served.push(id);
  }

  notify(message: JSONRPCMessage): void {
    if (this.events && !this.#ended) this.res.write(sseEvent(message));
  }

  answer(message: JSONRPCMessage): void {
    if (this.#ended) return;
    this.#answers.set((message as { id: RequestId }).id, message);
    if (this.events) this.res.write(sseEvent(message));
    if (this.#answers.size < this.requests.length) return;
    if (this.events) this.res.end();
    else {
      const body = this.batch
        ? this.requests.map((r) => this.#answers.get(r.id))
        : this.#answers.get(this.requests[0]!.id);
      sendJson(this.res, 200, body);
    }
    this.end();
  }

  /** Ends the exchange: releases its admission and requests, ends its span. Idempotent. */
  end(): void {
    if (this.#ended) return;
    this.#ended = true;
    this.release(this.#served);
    this.#span?.end();
  }
}
