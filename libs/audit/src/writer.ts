import type { AuditEventInput } from "./events.js";

/** An event waiting in a process's queue to be written, with what writing it needs. */
export interface QueuedEvent {
  readonly event: Omit<AuditEventInput, "id" | "by">;
  readonly id: string;
  /** The process that did the step. */
  readonly by: string;
  /** The hash of the record last published for it: whether an attempt whose answer was lost landed. */
  sealed?: string | undefined;
}

/** How one batch went: its first `written` events are written. */
export interface BatchOutcome {
  written: number;
  /**
   * Why the next one is not: another writer moved the tail, or the write failed. `unanswered`:
   * no resolver took the events handed on (none running, or none answering in time), which is
   * the mesh's state, not the tenant's.
   */
  failure?: "raced" | { err: unknown; unanswered?: true } | undefined;
}

/**
 * How a trail writes a tenant's queued events, in their order: into the chain itself
 * ({@link ChainWriter}, the resolvers) or by handing them to the resolvers
 * ({@link ForwardingWriter}, every other service). Never throws: a failure is an outcome.
 */
export interface BatchWriter {
  write(tenant: string, batch: readonly QueuedEvent[]): Promise<BatchOutcome>;
}
