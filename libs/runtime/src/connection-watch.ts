import type { NatsConnection } from "@nats-io/nats-core";

/**
 * What a process knows of its NATS connection, for readiness and liveness: connected or not,
 * and since when it has been down. Down for longer than the bound, the process is no longer
 * alive: it cannot reconnect (an expired certificate, a revoked credential, a server that
 * refuses it), and a restart with fresh files is what may help.
 */
export class ConnectionWatch {
  readonly #boundMs: number;
  readonly #now: () => number;
  #downSince: number | undefined;

  /** `boundMs`: how long the connection may be down and the process still alive, in ms. */
  constructor(boundMs: number, now: () => number = Date.now) {
    this.#boundMs = boundMs;
    this.#now = now;
  }

  /** Follows `nc`'s status until it closes; `onChange` hears each drop and return. */
  follow(nc: NatsConnection, onChange?: (up: boolean, server: string) => void): void {
    void (async () => {
      for await (const status of nc.status()) {
        if (status.type === "disconnect") {
          this.disconnected();
          onChange?.(false, String((status as { server?: string }).server ?? ""));
        } else if (status.type === "reconnect") {
          this.reconnected();
          onChange?.(true, String((status as { server?: string }).server ?? ""));
        }
      }
    })();
  }

  /** The connection dropped (a second drop while down keeps the first time). */
  disconnected(): void {
    this.#downSince ??= this.#now();
  }

  /** The connection is back. */
  reconnected(): void {
    this.#downSince = undefined;
  }

  /** Whether the connection is up. */
  connected(): boolean {
    return this.#downSince === undefined;
  }

  /** How long the connection has been down, in ms; 0 when up. */
  downForMs(): number {
    return this.#downSince === undefined ? 0 : this.#now() - this.#downSince;
  }

  /** Whether the process is alive: connected, or down for no longer than the bound. */
  alive(): boolean {
    return this.downForMs() <= this.#boundMs;
  }
}
