import type { NatsConnection } from "@nats-io/nats-core";
import type { KV, KvEntry } from "@nats-io/kv";
import { jetstreamManager } from "@nats-io/jetstream";
import type { StreamCompression } from "@toolmesh/nats";
import { isWrongLastSequence, meshPlan, openBucket } from "@toolmesh/nats";
import type { SessionAddress, Subjects } from "@toolmesh/protocol";
import { Defaults, decodeJson, encodeJson, subjectToken } from "@toolmesh/protocol";
import type { SessionPolicy } from "./policy.js";

/** What the schema expander remembers about one session (docs/protocol.md#schema-expansion-catalog-and-tool-groups). */
export interface SessionSchemasState {
  readonly session_id: string;
  /** Tools the session called with required arguments missing, or asked about; first first. */
  readonly requested_tools: readonly string[];
  /** Tools whose full schema the session received, with the registry revision it was at. */
  readonly expanded_tools: ReadonlyMap<string, number>;
  /** Epoch ms of the last change. */
  readonly updated_at: number;
}

/** A session's policy as stored: group switches and the bound agent. */
export interface SessionPolicyState extends SessionPolicy {
  readonly session_id: string;
  readonly updated_at: number;
}

/** A tenant's group switches as stored. */
export interface TenantGroupsState {
  readonly groups: ReadonlyMap<string, boolean>;
  readonly updated_at: number;
}

/** A value read from the store with the KV revision to update it against. */
export interface Revised<T> {
  readonly value: T;
  readonly revision: number;
}

/** What an update did. */
export interface UpdateOutcome<T> {
  /** The state after the update (the current one when nothing changed). */
  readonly value: T;
  /** Whether this call wrote it. */
  readonly changed: boolean;
}

/** Options of {@link StateStore.open}. Durations in ms. */
export interface StateStoreOptions {
  subjects: Subjects;
  /**
   * How long a session's state lives after its last change, in ms; an existing bucket with
   * another TTL is updated. Default 24 h.
   */
  sessionTtlMs?: number;
  /** Replicas of the buckets when created or updated. Default 1. */
  replicas?: number;
  /** Compression of the buckets (ADR 0044); left out, existing buckets keep their own. */
  compression?: StreamCompression;
}

const MAX_CAS_ATTEMPTS = 64;

/**
 * Per-session and per-tenant state in two KV buckets, changed only by compare-and-set:
 * `{p}_sessions` (with a TTL) holds `{tenant}.{session}.schemas` and `{tenant}.{session}.policy`,
 * `{p}_groups` holds each tenant's group switches under the tenant token.
 */
export class StateStore {
  readonly sessions: KV;
  readonly groups: KV;
  readonly subjects: Subjects;
  /** The sessions bucket's TTL as the server has it, in ms (0: none). */
  readonly sessionTtlMs: number;

  private constructor(subjects: Subjects, sessions: KV, groups: KV, sessionTtlMs: number) {
    this.subjects = subjects;
    this.sessions = sessions;
    this.groups = groups;
    this.sessionTtlMs = sessionTtlMs;
  }

  /** Opens both buckets, creating them when needed (the first service to start does). */
  static async open(nc: NatsConnection, options: StateStoreOptions): Promise<StateStore> {
    const { subjects } = options;
    const { buckets } = meshPlan(subjects, {
      replicas: options.replicas,
      ...(options.compression === undefined ? {} : { compression: options.compression }),
      sessionStateTtlMs: options.sessionTtlMs ?? Defaults.sessionStateTtlMs,
    });
    const jsm = await jetstreamManager(nc);
    const [sessions, groups] = await Promise.all([
      openBucket(nc, jsm, buckets.sessions),
      openBucket(nc, jsm, buckets.groups),
    ]);
    const status = await sessions.status();
    return new StateStore(subjects, sessions, groups, status.ttl);
  }

  /** The session's expansion state; `undefined` when it has none (or it expired). */
  async getSchemas(at: SessionAddress): Promise<Revised<SessionSchemasState> | undefined> {
    return read(this.sessions, this.subjects.sessionStateKey(at, "schemas"), decodeSchemas);
  }

  /**
   * Changes the session's expansion state by compare-and-set: `mutate` gets the current state
   * (an empty one when there is none) and returns the next, or `undefined` to leave it. It may
   * run several times when others write at once, so it must not have side effects.
   */
  updateSchemas(
    at: SessionAddress,
    sessionId: string,
    mutate: (current: SessionSchemasState) => SessionSchemasState | undefined,
  ): Promise<UpdateOutcome<SessionSchemasState>> {
    return update(
      this.sessions,
      this.subjects.sessionStateKey(at, "schemas"),
      decodeSchemas,
      encodeSchemas,
      () => ({
        session_id: sessionId,
        requested_tools: [],
        expanded_tools: new Map(),
        updated_at: 0,
      }),
      mutate,
    );
  }

  /** The session's policy; `undefined` when it has none (or it expired). */
  async getPolicy(at: SessionAddress): Promise<Revised<SessionPolicyState> | undefined> {
    return read(this.sessions, this.subjects.sessionStateKey(at, "policy"), decodePolicy);
  }

  /** Changes the session's policy by compare-and-set; as {@link StateStore.updateSchemas}. */
  updatePolicy(
    at: SessionAddress,
    sessionId: string,
    mutate: (current: SessionPolicyState) => SessionPolicyState | undefined,
  ): Promise<UpdateOutcome<SessionPolicyState>> {
    return update(
      this.sessions,
      this.subjects.sessionStateKey(at, "policy"),
      decodePolicy,
      encodePolicy,
      () => ({ session_id: sessionId, groups: new Map(), updated_at: 0 }),
      mutate,
    );
  }

  /** The tenant's group switches (none when it never switched a group). */
  async getTenantGroups(tenant: string): Promise<TenantGroupsState | undefined> {
    return (await read(this.groups, tenantKey(tenant), decodeTenantGroups))?.value;
  }

  /** Changes the tenant's group switches by compare-and-set. `tenant` is the tenant token. */
  updateTenantGroups(
    tenant: string,
    mutate: (current: TenantGroupsState) => TenantGroupsState | undefined,
  ): Promise<UpdateOutcome<TenantGroupsState>> {
    return update(
      this.groups,
      tenantKey(tenant),
      decodeTenantGroups,
      encodeTenantGroups,
      () => ({ groups: new Map(), updated_at: 0 }),
      mutate,
    );
  }
}

// The tenant slot of a subject is already a token; mapping it again keeps a raw id safe too.
function tenantKey(tenant: string): string {
  return subjectToken(tenant);
}

async function read<T>(
  kv: KV,
  key: string,
  decode: (data: Uint8Array) => T | undefined,
): Promise<Revised<T> | undefined> {
  const entry = await kv.get(key);
  if (entry === null || entry.operation !== "PUT") return undefined;
  const value = decode(entry.value);
  return value === undefined ? undefined : { value, revision: entry.revision };
}

async function update<T extends { updated_at: number }>(
  kv: KV,
  key: string,
  decode: (data: Uint8Array) => T | undefined,
  encode: (value: T) => Uint8Array,
  fresh: () => T,
  mutate: (current: T) => T | undefined,
): Promise<UpdateOutcome<T>> {
  for (let attempt = 0; attempt < MAX_CAS_ATTEMPTS; attempt++) {
    const entry: KvEntry | null = await kv.get(key);
    const live = entry !== null && entry.operation === "PUT";
    // A value that does not decode (written by something else) is replaced.
    const current = (live ? decode(entry.value) : undefined) ?? fresh();
    const next = mutate(current);
    if (next === undefined) return { value: current, changed: false };
    const written = { ...next, updated_at: Date.now() };
    const data = encode(written);
    try {
      if (live) await kv.update(key, data, entry.revision);
      else await kv.create(key, data);
      return { value: written, changed: true };
    } catch (err) {
      if (!isWrongLastSequence(err)) throw err;
      // Someone else wrote first: read again and re-apply.
    }
  }
  throw new Error(`state key ${key} kept changing under ${MAX_CAS_ATTEMPTS} updates in a row`);
}

// ---- encoding: JSON objects on the wire, Maps in memory (no prototype keys involved) ----

/** Decodes a session's expansion state; `undefined` for anything else. */
export function decodeSchemas(data: Uint8Array): SessionSchemasState | undefined {
  const v = safeJson(data);
  if (!isRecord(v) || typeof v.session_id !== "string") return undefined;
  return {
    session_id: v.session_id,
    requested_tools: Array.isArray(v.requested_tools)
      ? v.requested_tools.filter((t): t is string => typeof t === "string")
      : [],
    expanded_tools: ownEntries(v.expanded_tools, (r): r is number => Number.isInteger(r)),
    updated_at: typeof v.updated_at === "number" ? v.updated_at : 0,
  };
}

function encodeSchemas(s: SessionSchemasState): Uint8Array {
  return encodeJson({
    session_id: s.session_id,
    requested_tools: s.requested_tools,
    expanded_tools: Object.fromEntries(s.expanded_tools),
    updated_at: s.updated_at,
  });
}

/** Decodes a session policy; `undefined` for anything else. */
export function decodePolicy(data: Uint8Array): SessionPolicyState | undefined {
  const v = safeJson(data);
  if (!isRecord(v) || typeof v.session_id !== "string") return undefined;
  return {
    session_id: v.session_id,
    agent: typeof v.agent === "string" ? v.agent : undefined,
    groups: ownEntries(v.groups, (a): a is boolean => typeof a === "boolean"),
    updated_at: typeof v.updated_at === "number" ? v.updated_at : 0,
  };
}

function encodePolicy(p: SessionPolicyState): Uint8Array {
  return encodeJson({
    session_id: p.session_id,
    ...(p.agent === undefined ? {} : { agent: p.agent }),
    groups: Object.fromEntries(p.groups),
    updated_at: p.updated_at,
  });
}

/** Decodes a tenant's group switches; `undefined` for anything else. */
export function decodeTenantGroups(data: Uint8Array): TenantGroupsState | undefined {
  const v = safeJson(data);
  if (!isRecord(v)) return undefined;
  return {
    groups: ownEntries(v.groups, (a): a is boolean => typeof a === "boolean"),
    updated_at: typeof v.updated_at === "number" ? v.updated_at : 0,
  };
}

function encodeTenantGroups(g: TenantGroupsState): Uint8Array {
  return encodeJson({ groups: Object.fromEntries(g.groups), updated_at: g.updated_at });
}

function ownEntries<T>(value: unknown, check: (v: unknown) => v is T): Map<string, T> {
  const out = new Map<string, T>();
  if (!isRecord(value)) return out;
  for (const [key, item] of Object.entries(value)) if (check(item)) out.set(key, item);
  return out;
}

function safeJson(data: Uint8Array): unknown {
  try {
    return decodeJson(data);
  } catch {
    return undefined;
  }
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}
