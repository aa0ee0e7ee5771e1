import type { NatsConnection } from "@nats-io/nats-core";
import type { JetStreamManager, StreamInfo } from "@nats-io/jetstream";
import type { Subjects } from "@toolmesh/protocol";
import { QuotaStore } from "@toolmesh/catalog";

/**
 * What one stream holds against its byte bound (ADR 0050), from the server; or, as stream
 * `results`, the bytes of results a tenant's calls have stored (sessions stream and call
 * records) against the tenant's bound.
 */
export interface StreamUsage {
  stream: string;
  /** Whose it is: the mesh's, a tenant's calls stream, or a tool owner's work stream. */
  of: "mesh" | "tenant" | "owner";
  /** The tenant or owner token, for theirs. */
  id?: string;
  bytes: number;
  /** Messages it holds; absent for a tenant's results. */
  messages?: number;
  /** The stream's `max_bytes`; -1 when it has none (made before the bound existed). */
  max_bytes: number;
}

/**
 * The bytes every stream of the mesh holds against its bound: the mesh's own, every tenant's
 * calls stream and every owner's work stream (those listed where this user may list streams).
 */
export async function readStorage(
  jsm: JetStreamManager,
  subjects: Subjects,
): Promise<StreamUsage[]> {
  const named: { stream: string; of: StreamUsage["of"]; id?: string }[] = Object.values(
    subjects.streams,
  ).map((stream) => ({ stream, of: "mesh" }));
  const listed = async (filter: string, of: "tenant" | "owner", stem: string) => {
    try {
      for await (const stream of jsm.streams.names(filter))
        if (stream.startsWith(`${stem}_`))
          named.push({ stream, of, id: stream.slice(stem.length + 1) });
    } catch {
      // Not allowed to list streams: the mesh's only.
    }
  };
  await listed(subjects.allTenantStreamCalls, "tenant", subjects.streams.calls);
  await listed(subjects.allOwnerWork, "owner", subjects.streams.work);
  const usage = await Promise.all(
    named.map(async (n): Promise<StreamUsage | undefined> => {
      const info: StreamInfo | undefined = await jsm.streams.info(n.stream).catch(() => undefined);
      if (info === undefined) return undefined;
      return {
        ...n,
        bytes: info.state.bytes,
        messages: info.state.messages,
        max_bytes: info.config.max_bytes,
      };
    }),
  );
  return usage.filter((u): u is StreamUsage => u !== undefined);
}

/** Where `toolmesh stats` reads tenants' stored results from, and their default bound. */
export interface StoredResultsOptions {
  /** Every tenant's bound unless its quota says otherwise (`TOOLMESH_TENANT_MAX_STORED_BYTES`). */
  defaultBound: number;
  /** How long a result is kept: the longer of the call retention and the sessions', in ms. */
  windowMs: number;
}

/** Each tenant's stored results against its bound, as rows of the storage table. */
export async function readStoredResults(
  nc: NatsConnection,
  subjects: Subjects,
  options: StoredResultsOptions,
): Promise<StreamUsage[]> {
  // Loaded here, not with the CLI: only `stats` reads stored results.
  const { readStored } = await import("@toolmesh/resolver");
  try {
    const stored = await readStored(nc, subjects, {
      now: Date.now(),
      windowMs: options.windowMs,
    });
    if (stored.size === 0) return [];
    const quotas = await QuotaStore.open(nc, { subjects });
    const bounds = new Map(
      (await quotas.list()).map((q) => [q.key, q.quota.max_stored_bytes] as const),
    );
    return [...stored].map(([tenant, bytes]) => ({
      stream: "results",
      of: "tenant" as const,
      id: tenant,
      bytes,
      max_bytes: bounds.get(tenant) ?? (options.defaultBound > 0 ? options.defaultBound : -1),
    }));
  } catch {
    // No quota usage bucket yet, or not allowed to read it: streams only.
    return [];
  }
}

function mib(bytes: number): string {
  return `${(bytes / 1024 ** 2).toFixed(1)}M`;
}

/** `STREAM OF USED BOUND %` lines, fullest first. */
export function renderStorage(usage: readonly StreamUsage[]): string[] {
  const share = (u: StreamUsage) => (u.max_bytes > 0 ? u.bytes / u.max_bytes : 0);
  const rows = [...usage]
    .sort((a, b) => share(b) - share(a) || a.stream.localeCompare(b.stream))
    .map((u) => [
      u.stream,
      u.id === undefined ? u.of : `${u.of} ${u.id}`,
      mib(u.bytes),
      u.max_bytes > 0 ? mib(u.max_bytes) : "none",
      u.max_bytes > 0 ? `${(share(u) * 100).toFixed(1)}%` : "-",
    ]);
  const header = ["STREAM", "OF", "USED", "BOUND", "FULL"];
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? "").length)));
  return [header, ...rows].map((cells) =>
    cells
      .map((c, i) => (i < 2 ? c.padEnd(widths[i] ?? 0) : c.padStart(widths[i] ?? 0)))
      .join("  ")
      .trimEnd(),
  );
}
