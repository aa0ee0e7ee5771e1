import { createHash } from "node:crypto";
import { ErrorCode, ToolmeshError } from "./errors.js";

/** Wire version carried in every subject. */
export const PROTOCOL_VERSION = "v1";

/** Longest subject token a name maps to, in characters. */
export const MAX_TOKEN_LENGTH = 64;

/** Default subject prefix. */
export const DEFAULT_PREFIX = "toolmesh";

/** Default tenant (frontend) id when none is configured. */
export const DEFAULT_TENANT = "default";

const SAFE_TOKEN = /^[A-Za-z0-9_-]+$/;
const HASH_CHARS = 24;
const KEEP_CHARS = MAX_TOKEN_LENGTH - HASH_CHARS - 2;

/**
 * Maps any non-empty name (tool name, session id, tenant id, call id) to one subject token.
 *
 * Characters `A-Z a-z 0-9 _ -` are kept; every other UTF-8 byte becomes `=XX` (lower-case
 * hex). A result longer than {@link MAX_TOKEN_LENGTH} is cut to its first 38 characters
 * followed by `==` and the first 24 hex digits of the SHA-256 of the name. The result is a
 * valid subject token and a valid KV key: it never holds `.`, `*`, `>`, spaces or control
 * characters, so no name can reach another subject. Distinct names give distinct tokens
 * (up to SHA-256 collisions for names longer than the limit).
 */
export function subjectToken(name: string): string {
  if (name.length === 0) {
    throw new ToolmeshError(
      ErrorCode.InvalidRequest,
      "a name mapped to a subject must not be empty",
    );
  }
  if (name.length <= MAX_TOKEN_LENGTH && SAFE_TOKEN.test(name)) return name;
  let out = "";
  for (const byte of Buffer.from(name, "utf8")) {
    const isSafe =
      (byte >= 0x30 && byte <= 0x39) ||
      (byte >= 0x41 && byte <= 0x5a) ||
      (byte >= 0x61 && byte <= 0x7a) ||
      byte === 0x5f ||
      byte === 0x2d;
    out += isSafe ? String.fromCharCode(byte) : `=${byte.toString(16).padStart(2, "0")}`;
    if (out.length > MAX_TOKEN_LENGTH) break;
  }
  if (out.length <= MAX_TOKEN_LENGTH) return out;
  const digest = createHash("sha256").update(name, "utf8").digest("hex").slice(0, HASH_CHARS);
  return `${out.slice(0, KEEP_CHARS)}==${digest}`;
}

/** Options for {@link createSubjects}. */
export interface SubjectOptions {
  /** Dot-separated prefix of every subject, each part `[A-Za-z0-9_-]+`. Default `toolmesh`. */
  prefix?: string;
}

/**
 * Where a session lives: its tenant and session ids already mapped to subject tokens.
 * Built from ids by {@link Subjects.address}, or read back from a subject by
 * {@link Subjects.parseSessionSubject}.
 */
export interface SessionAddress {
  readonly tenant: string;
  readonly session: string;
}

/** Stream, bucket and subject names for one prefix. Build once, reuse. */
export interface Subjects {
  readonly prefix: string;
  /** Maps a tenant id and a session id to their subject tokens. */
  address(tenant: string, session: string): SessionAddress;
  /** Where a frontend publishes a call: `{p}.v1.calls.{tenant}.{session}`. */
  call(at: SessionAddress): string;
  /** Wildcard over every call subject (the calls stream). */
  readonly allCalls: string;
  /** Where a frontend publishes a cancellation: `{p}.v1.cancel.{tenant}.{session}`. */
  cancel(at: SessionAddress): string;
  /** Where resolved calls wait for an executor: `{p}.v1.work.{tool}`. */
  work(tool: string): string;
  /** Wildcard over every work subject (the work stream). */
  readonly allWork: string;
  /** Every event of one session: `{p}.v1.sessions.{tenant}.{session}.>`. */
  sessionEvents(at: SessionAddress): string;
  /** The final message of one call: `{p}.v1.sessions.{tenant}.{session}.result.{call}`. */
  result(at: SessionAddress, callId: string): string;
  /** Progress of one call: `{p}.v1.sessions.{tenant}.{session}.progress.{call}`. */
  progress(at: SessionAddress, callId: string): string;
  /** A tool schema sent to a session: `{p}.v1.sessions.{tenant}.{session}.schema.{tool}`. */
  schema(at: SessionAddress, tool: string): string;
  /** Subjects of session events that are kept in the sessions stream. */
  readonly storedSessionEvents: readonly string[];
  /** Missing-arguments events: `{p}.v1.events.missing.{tenant}.{tool}` (session in the body). */
  missingArguments(at: SessionAddress, tool: string): string;
  /** Wildcard over every event subject (the events stream). */
  readonly allEvents: string;
  /** Request-reply: dry-run resolution, `{p}.v1.rpc.{tenant}.resolve`. */
  resolveRpc(tenant: string): string;
  /** Wildcard over every tenant's resolve requests (the resolver's subscription). */
  readonly allResolveRpc: string;
  /** Reads the tenant token back from a request-reply subject. */
  parseRpcTenant(subject: string): string | undefined;
  /** Reads the kind (`result`, `progress`, `schema`) back from a session event subject. */
  sessionEventKind(subject: string): string | undefined;
  /** Reads the session address back from a call or cancel subject. */
  parseSessionSubject(subject: string): SessionAddress | undefined;
  /** JetStream stream names. */
  readonly streams: {
    readonly calls: string;
    readonly work: string;
    readonly sessions: string;
    readonly events: string;
  };
  /** KV bucket holding the tool registry. */
  readonly registryBucket: string;
  /** Durable consumer name for one tool's work, shared by every executor of the tool. */
  workConsumer(tool: string): string;
  /** Durable consumer name of the resolver on the calls stream. */
  readonly resolverConsumer: string;
}

const PREFIX_PART = /^[A-Za-z0-9_-]+$/;

/** Validates a prefix; throws `invalid_request` naming the offending part. */
export function assertValidPrefix(prefix: string): void {
  const parts = prefix.split(".");
  for (const part of parts) {
    if (!PREFIX_PART.test(part)) {
      throw new ToolmeshError(
        ErrorCode.InvalidRequest,
        `invalid subject prefix "${prefix}": part "${part}" must match [A-Za-z0-9_-]+`,
      );
    }
  }
}

/** Builds every subject, stream and bucket name for a prefix. The only place subjects are made. */
export function createSubjects(options: SubjectOptions = {}): Subjects {
  const prefix = options.prefix ?? DEFAULT_PREFIX;
  assertValidPrefix(prefix);
  const base = `${prefix}.${PROTOCOL_VERSION}`;
  const t = subjectToken;
  const stem = prefix.replace(/\./g, "_").toUpperCase();
  const bucketStem = prefix.replace(/\./g, "_").toLowerCase();
  const baseParts = base.split(".").length;

  return {
    prefix,
    address: (tenant, session) => ({ tenant: t(tenant), session: t(session) }),
    call: (at) => `${base}.calls.${at.tenant}.${at.session}`,
    allCalls: `${base}.calls.*.*`,
    cancel: (at) => `${base}.cancel.${at.tenant}.${at.session}`,
    work: (tool) => `${base}.work.${t(tool)}`,
    allWork: `${base}.work.*`,
    sessionEvents: (at) => `${base}.sessions.${at.tenant}.${at.session}.>`,
    result: (at, callId) => `${base}.sessions.${at.tenant}.${at.session}.result.${t(callId)}`,
    progress: (at, callId) => `${base}.sessions.${at.tenant}.${at.session}.progress.${t(callId)}`,
    schema: (at, tool) => `${base}.sessions.${at.tenant}.${at.session}.schema.${t(tool)}`,
    storedSessionEvents: [`${base}.sessions.*.*.result.*`, `${base}.sessions.*.*.schema.*`],
    missingArguments: (at, tool) => `${base}.events.missing.${at.tenant}.${t(tool)}`,
    allEvents: `${base}.events.>`,
    resolveRpc: (tenant) => `${base}.rpc.${t(tenant)}.resolve`,
    allResolveRpc: `${base}.rpc.*.resolve`,
    parseRpcTenant: (subject) => subject.split(".")[baseParts + 1],
    sessionEventKind: (subject) => subject.split(".")[baseParts + 3],
    parseSessionSubject(subject) {
      const parts = subject.split(".");
      if (parts.length !== baseParts + 3) return undefined;
      const tenant = parts[baseParts + 1];
      const session = parts[baseParts + 2];
      if (tenant === undefined || session === undefined) return undefined;
      return { tenant, session };
    },
    streams: {
      calls: `${stem}_CALLS`,
      work: `${stem}_WORK`,
      sessions: `${stem}_SESSIONS`,
      events: `${stem}_EVENTS`,
    },
    registryBucket: `${bucketStem}_tools`,
    workConsumer: (tool) => `work_${t(tool)}`,
    resolverConsumer: "resolver",
  };
}
