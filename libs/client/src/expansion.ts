import type { NatsConnection } from "@nats-io/nats-core";
import type { z } from "zod";
import type { SchemaEvent, ToolSchema, WireError } from "@toolmesh/protocol";
import { requestOk } from "@toolmesh/nats";
import type { CatalogEntry } from "./formats/catalog.js";
import type { SupplementedSchema } from "./formats/supplemented.js";

/** Changes of tool groups: each name switched on, off, or back to the wider scope's setting. */
export interface GroupChanges {
  enable?: string[];
  disable?: string[];
  /** Drop this scope's switch: the tenant's (or the default, active) applies again. */
  reset?: string[];
}

/**
 * Sends a request to the schema expander and returns its successful reply. A failed reply
 * (`ok: false`) is thrown as its typed error; no schema expander running → `unavailable`.
 */
export async function requestSchemaExpander<T extends { ok: true }>(
  nc: NatsConnection,
  subject: string,
  body: unknown,
  schema: z.ZodType<T | { ok: false; error: WireError }>,
  timeoutMs: number,
): Promise<T> {
  return requestOk(nc, subject, body, schema, { timeoutMs, service: "schema expander" });
}

/** A page of the catalog, as the schema expander answers a catalog request. */
interface CatalogPage {
  ok: true;
  tools: unknown[];
  next_cursor?: string | undefined;
}

/**
 * The whole catalog, read page by page: `ask` requests the page at `cursor` (none for the
 * first) until a page names no `next_cursor`. A tool on two pages (the registry changed between
 * them) is kept once. What comes back names no cursor.
 */
export async function readCatalog<T extends CatalogPage>(
  ask: (cursor: string | undefined) => Promise<T>,
): Promise<T> {
  const first = await ask(undefined);
  const tools = [...first.tools];
  const seen = new Set(tools.map(nameOf));
  for (let page = first; page.next_cursor !== undefined;) {
    page = await ask(page.next_cursor);
    for (const tool of page.tools) {
      if (seen.has(nameOf(tool))) continue;
      seen.add(nameOf(tool));
      tools.push(tool);
    }
  }
  const { next_cursor: _last, ...whole } = first;
  return { ...whole, tools } as T;
}

function nameOf(entry: unknown): unknown {
  return (entry as { name?: unknown }).name;
}

interface Waiter {
  tool: string;
  resolve(schema: SchemaEvent | undefined): void;
  timer: NodeJS.Timeout;
}

/**
 * The schemas one session received (schema events and `describe` replies): the latest per tool,
 * and those not yet handed to the model (the pending schemas for the next turn, docs/protocol.md#schema-expansion-catalog-and-tool-groups).
 */
export class SchemaInbox {
  readonly #latest = new Map<string, ToolSchema>();
  readonly #pending = new Map<string, SupplementedSchema>();
  readonly #waiters = new Set<Waiter>();

  /** Records a schema event; wakes whoever waits for its tool. */
  received(event: SchemaEvent): void {
    this.#remember(event, event.missing);
    for (const waiter of this.#waiters) {
      if (waiter.tool !== event.tool) continue;
      this.#waiters.delete(waiter);
      clearTimeout(waiter.timer);
      waiter.resolve(event);
    }
  }

  /** Records schemas from a `describe` reply. */
  described(schemas: readonly ToolSchema[]): void {
    for (const schema of schemas) this.#remember(schema, []);
  }

  /** The latest schema received for each tool. */
  latest(): ReadonlyMap<string, ToolSchema> {
    return this.#latest;
  }

  /** Hands over the schemas not yet given to the model, and forgets them as pending. */
  take(): SupplementedSchema[] {
    const out = [...this.#pending.values()];
    this.#pending.clear();
    return out;
  }

  /** Whether a schema for the tool is pending. */
  hasPending(tool: string): boolean {
    return this.#pending.has(tool);
  }

  /** Resolves with the next schema event for `tool`, or `undefined` after `timeoutMs`. */
  next(tool: string, timeoutMs: number): Promise<SchemaEvent | undefined> {
    return new Promise((resolve) => {
      const waiter: Waiter = {
        tool,
        resolve,
        timer: setTimeout(() => {
          this.#waiters.delete(waiter);
          resolve(undefined);
        }, timeoutMs),
      };
      this.#waiters.add(waiter);
    });
  }

  /** Wakes every waiter with `undefined` (the session closed). */
  close(): void {
    for (const waiter of this.#waiters) {
      clearTimeout(waiter.timer);
      waiter.resolve(undefined);
    }
    this.#waiters.clear();
  }

  /**
   * The entries with every tool whose schema was received upgraded to its expanded form
   * (full parameters and description), so the next turn declares it completely.
   */
  expand<E extends CatalogEntry>(entries: readonly E[]): E[] {
    return entries.map((entry) => {
      const schema = this.#latest.get(entry.name);
      if (schema === undefined) return entry;
      const expanded: E = { ...entry, parameters: schema.parameters };
      if (schema.description.trim() !== "") expanded.description = schema.description;
      return expanded;
    });
  }

  #remember(schema: ToolSchema, missing: readonly string[]): void {
    const known = this.#latest.get(schema.tool);
    if (known === undefined || known.revision <= schema.revision)
      this.#latest.set(schema.tool, schema);
    const pending = this.#pending.get(schema.tool);
    const merged = [...new Set([...(pending?.missing ?? []), ...missing])];
    this.#pending.set(schema.tool, {
      tool: schema.tool,
      parameters: schema.parameters,
      missing: merged,
      ...(schema.description.trim() === "" ? {} : { description: schema.description }),
    });
  }
}
