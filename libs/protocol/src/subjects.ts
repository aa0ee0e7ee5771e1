import { createHash } from "node:crypto";
import { Defaults } from "./defaults.js";
import { ErrorCode, ToolmeshError } from "./errors.js";
import type { OwnerService } from "./owner.js";
import { OWNER_SERVICES } from "./owner.js";

/** Wire version carried in every subject. */
export const PROTOCOL_VERSION = "v1";

/** Longest subject token a name maps to, in characters. */
export const MAX_TOKEN_LENGTH = 64;

const SAFE_TOKEN = /^[A-Za-z0-9_-]+$/;
const HASH_CHARS = 24;
const KEEP_CHARS = MAX_TOKEN_LENGTH - HASH_CHARS - 2;

/**
 * JetStream's advisories of a newly elected stream leader, every stream of the account (NATS's
 * own subjects, the same under every prefix).
 */
export const STREAM_LEADER_ELECTED_ADVISORIES = "$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.>";

/** JetStream's advisory of a newly elected leader of one consumer. */
export function consumerLeaderElectedAdvisory(stream: string, consumer: string): string {
  return `$JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED.${stream}.${consumer}`;
}

/**
 * Maps any non-empty name (tool name, session id, tenant id, call id) to one subject token.
 *
 * Characters `A-Z a-z 0-9 _ -` are kept; every other UTF-8 byte becomes `=XX` (lower-case
 * hex). A result longer than {@link MAX_TOKEN_LENGTH} is cut to its first 38 characters
 * followed by `==` and the first 24 hex digits of the SHA-256 of the name. The result is a
 * valid subject token and a valid KV key: it never holds `.`, `*`, `>`, spaces or control
 * characters, so no name can reach another subject. Distinct names give distinct tokens
 * (up to SHA-256 collisions for names longer than the limit). A name holding a lone UTF-16
 * surrogate is escaped per code unit instead (`=uXXXX`), hashed over its UTF-16LE bytes.
 */
export function subjectToken(name: string): string {
  if (name.length === 0) {
    throw new ToolmeshError(
      ErrorCode.InvalidRequest,
      "a name mapped to a subject must not be empty",
    );
  }
  if (name.length <= MAX_TOKEN_LENGTH && SAFE_TOKEN.test(name)) return name;
  // A lone surrogate has no UTF-8 form: such names are escaped per UTF-16 code unit as
  // `=uXXXX`, which no well-formed name produces, so distinct names keep distinct tokens.
  const wellFormed = name.isWellFormed();
  const units: Iterable<number> = wellFormed ? Buffer.from(name, "utf8") : codeUnits(name);
  let out = "";
  for (const unit of units) {
    out += isSafeByte(unit)
      ? String.fromCharCode(unit)
      : wellFormed
        ? `=${unit.toString(16).padStart(2, "0")}`
        : `=u${unit.toString(16).padStart(4, "0")}`;
    if (out.length > MAX_TOKEN_LENGTH) break;
  }
  if (out.length <= MAX_TOKEN_LENGTH) return out;
  const digest = createHash("sha256")
    .update(wellFormed ? Buffer.from(name, "utf8") : Buffer.from(name, "utf16le"))
    .digest("hex")
    .slice(0, HASH_CHARS);
  return `${out.slice(0, KEEP_CHARS)}==${digest}`;
}

// What `subjectToken` can produce: safe characters and `=` escapes, at most 64 of them.
const TOKEN_SHAPE = /^[A-Za-z0-9_=-]{1,64}$/;

/**
 * Whether `token` could have come from {@link subjectToken}: 1–64 characters out of
 * `A-Z a-z 0-9 _ - =`. Tokens read back from a received subject are checked with it, so a
 * raw publish holding a literal `*` or `>` (or any other character) is refused, not answered.
 */
export function isSubjectToken(token: string | undefined): token is string {
  return token !== undefined && TOKEN_SHAPE.test(token);
}

/**
 * The key that names one call across the whole mesh: `{tenant}.{session}.{token of the
 * idempotency key}`. Idempotency keys are scoped by it: the same key sent from two sessions
 * (or two tenants) names two calls. It keys the call record and bases every message id the
 * mesh sets for the call.
 */
export function callKey(at: SessionAddress, idempotencyKey: string): string {
  return `${at.tenant}.${at.session}.${subjectToken(idempotencyKey)}`;
}

/**
 * The idempotency key a tool handler receives (`ctx.idempotencyKey`, MCP `_meta`, the native
 * `idempotency-key` header): `{tenant token}/{session token}/{idempotency key}`. Tokens never
 * hold `/`, so it names one call across every tenant and session of the mesh.
 */
export function scopedIdempotencyKey(at: SessionAddress, idempotencyKey: string): string {
  return `${at.tenant}/${at.session}/${idempotencyKey}`;
}

function isSafeByte(unit: number): boolean {
  return (
    (unit >= 0x30 && unit <= 0x39) ||
    (unit >= 0x41 && unit <= 0x5a) ||
    (unit >= 0x61 && unit <= 0x7a) ||
    unit === 0x5f ||
    unit === 0x2d
  );
}

function* codeUnits(text: string): Generator<number> {
  for (let i = 0; i < text.length; i++) yield text.charCodeAt(i);
}

/** Options for {@link createSubjects}. */
export interface SubjectOptions {
  /** Dot-separated prefix of every subject, each part `[a-z0-9-]+`. Default `toolmesh`. */
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
  /**
   * Where a call of tenant `at.tenant` is stored when the tenant has a calls stream of its own
   * (ADR 0048): `{p}.v1.tenant-calls.{tenant}.{session}`. A tenant account publishes on
   * {@link call} and its import renames it to this.
   */
  tenantStreamCall(at: SessionAddress): string;
  /** Wildcard over the calls of tenant `tenant`'s own stream: `{p}.v1.tenant-calls.{tenant}.*`. */
  tenantStreamCalls(tenant: string): string;
  /** Wildcard over the calls of every tenant's own stream: `{p}.v1.tenant-calls.*.*`. */
  readonly allTenantStreamCalls: string;
  /**
   * The stream holding calls: the mesh's `{P}_CALLS`, or `{P}_CALLS_{tenant}` for a tenant with a
   * calls stream of its own (ADR 0048).
   */
  callsStream(tenant?: string): string;
  /** Whether `stream` is the mesh's calls stream or a tenant's. */
  isCallsStream(stream: string): boolean;
  /**
   * The audit stream of the tenant whose subject token is `tenant` (ADR 0060), in the mesh
   * account: `{P}_AUDIT_{tenant}`. Takes the token (`SessionAddress.tenant`), not the name.
   */
  auditStream(tenant: string): string;
  /** Where the audit events of the tenant with token `tenant` are written: `{p}.v1.audit.{tenant}`. */
  audit(tenant: string): string;
  /**
   * Where a service that does not chain events itself hands a tenant's events to the resolvers,
   * which write them into the tenant's chain (ADR 0064): `{p}.v1.audit-write.{tenant}`.
   */
  auditWrite(tenant: string): string;
  /** Every tenant's {@link auditWrite}: what the resolvers serve in one queue group. */
  readonly allAuditWrites: string;
  /**
   * Where the resolvers' push consumer of every tenant's calls stream delivers (ADR 0048):
   * `{p}.v1.intake`, read by every resolver in one queue group. One literal subject for every
   * tenant: the server counts a push consumer's interest by its deliver subject as written, so
   * a wildcard subscription would leave every consumer idle.
   */
  readonly intake: string;
  /** Request-reply: cancel a call of a session, `{p}.v1.cancel.{tenant}.{session}`. */
  cancel(at: SessionAddress): string;
  /** Wildcard over every cancel subject (the resolver's subscription). */
  readonly allCancel: string;
  /**
   * Core broadcast telling the mesh account's executors to abort a running call of a mesh tool:
   * `{p}.v1.control.abort`.
   */
  readonly abort: string;
  /**
   * The abort broadcast of the calls of tool owner `owner`'s tools, `{p}.v1.control.abort.{owner}`:
   * exported to that owner's account alone, so an owner hears of its own calls only.
   */
  ownerAbort(owner: string): string;
  /** The abort subject of a call in work stream `stream` (the mesh's, or an owner's). */
  abortOf(stream: string): string;
  /** Dead letters of a tool: `{p}.v1.dlq.{tool}`. */
  dlq(tool: string): string;
  /** Wildcard over every dead letter (the dead-letter stream). */
  readonly allDlq: string;
  /** Server advisory sent when a consumer of `stream` gives up on a message. */
  maxDeliveriesAdvisory(stream: string): string;
  /**
   * Where resolved calls wait for an executor: `{p}.v1.work.{tool}` on the mesh's work stream,
   * or `{p}.v1.work.{owner}.{tool}` on the work stream of tool owner `owner` (ADR 0041).
   */
  work(tool: string, owner?: string): string;
  /** Wildcard over every work subject of the mesh's work stream. */
  readonly allWork: string;
  /** Wildcard over every work subject of every owner's work stream: `{p}.v1.work.*.*`. */
  readonly allOwnerWork: string;
  /** Wildcard over the work subjects of tool owner `owner`: `{p}.v1.work.{owner}.*`. */
  ownerWork(owner: string): string;
  /**
   * The stream holding a tool's work: the mesh's `{P}_WORK`, or `{P}_WORK_{owner}` for a tool
   * of owner `owner` (the owner id as it is, so distinct owners never share one).
   */
  workStream(owner?: string): string;
  /** The work stream a work subject belongs to; undefined for any other subject. */
  workStreamOf(subject: string): string | undefined;
  /** Whether `stream` is the mesh's work stream or an owner's. */
  isWorkStream(stream: string): boolean;
  /**
   * Where a work stream republishes the headers (no body) of each work message it stores, for
   * the deadline keepers (ADR 0066): `{p}.v1.heads.work.{tool}`, `{p}.v1.heads.work.{owner}.{tool}`.
   * A republish destination: the tool token is `{{wildcard(1)}}`.
   */
  workHeads(owner?: string): string;
  /** Wildcard over every work stream's republished headers: `{p}.v1.heads.work.>`. */
  readonly allWorkHeads: string;
  /**
   * Where the sessions stream republishes the headers of each final message it stores:
   * `{p}.v1.heads.result.{tenant}.{session}.{call}`, as a republish destination.
   */
  readonly resultHeads: string;
  /** Wildcard over the final messages' republished headers: `{p}.v1.heads.result.>`. */
  readonly allResultHeads: string;
  /** Every event of one session: `{p}.v1.sessions.{tenant}.{session}.>`. */
  sessionEvents(at: SessionAddress): string;
  /** The final message of one call: `{p}.v1.sessions.{tenant}.{session}.result.{call}`. */
  result(at: SessionAddress, callId: string): string;
  /** Wildcard over every session's final messages. */
  readonly allResults: string;
  /** Reads the session address and call token back from a final message's subject. */
  parseResultSubject(subject: string): { address: SessionAddress; call: string } | undefined;
  /**
   * The answer to one submission that was refused without touching any call (an
   * `idempotency_conflict`): `{p}.v1.sessions.{tenant}.{session}.rejected.{seq}`, `seq` being
   * the submission's sequence in the calls stream (its PubAck's `seq`).
   */
  rejected(at: SessionAddress, seq: number): string;
  /** Progress of one call: `{p}.v1.sessions.{tenant}.{session}.progress.{call}`. */
  progress(at: SessionAddress, callId: string): string;
  /** A tool schema sent to a session: `{p}.v1.sessions.{tenant}.{session}.schema.{tool}`. */
  schema(at: SessionAddress, tool: string): string;
  /**
   * A call of the session waits for approval:
   * `{p}.v1.sessions.{tenant}.{session}.approval.{call}` (ADR 0059).
   */
  approvalRequired(at: SessionAddress, callId: string): string;
  /** Request-reply of approvers: list or decide waiting calls, `{p}.v1.approvals.{tenant}`. */
  approvalsRpc(tenant: string): string;
  /** Wildcard over every tenant's approval requests (the resolver's subscription). */
  readonly allApprovalsRpc: string;
  /** Request-reply of callers: confirm a waiting call, `{p}.v1.confirm.{tenant}.{session}`. */
  confirm(at: SessionAddress): string;
  /** Wildcard over every session's confirm requests. */
  readonly allConfirm: string;
  /** Subjects of session events that are kept in the sessions stream. */
  readonly storedSessionEvents: readonly string[];
  /** Missing-arguments events: `{p}.v1.events.missing.{tenant}.{tool}` (session in the body). */
  missingArguments(at: SessionAddress, tool: string): string;
  /** Wildcard over every event subject (the events stream). */
  readonly allEvents: string;
  /** Wildcard over every missing-arguments event (the schema expander's consumer filter). */
  readonly allMissingArguments: string;
  /** Request-reply: dry-run resolution, `{p}.v1.rpc.{tenant}.resolve`. */
  resolveRpc(tenant: string): string;
  /** Wildcard over every tenant's resolve requests (the resolver's subscription). */
  readonly allResolveRpc: string;
  /** Request-reply: the compact catalog of a session or agent, `{p}.v1.rpc.{tenant}.catalog`. */
  catalogRpc(tenant: string): string;
  /** Wildcard over every tenant's catalog requests (the schema expander's subscription). */
  readonly allCatalogRpc: string;
  /** Request-reply: full schemas of tools, now, `{p}.v1.rpc.{tenant}.describe`. */
  describeRpc(tenant: string): string;
  /** Wildcard over every tenant's describe requests. */
  readonly allDescribeRpc: string;
  /** Request-reply: send a tool's schema to a session again, `{p}.v1.rpc.{tenant}.expand`. */
  expandRpc(tenant: string): string;
  /** Wildcard over every tenant's expand requests. */
  readonly allExpandRpc: string;
  /** Request-reply: list or switch tool groups, `{p}.v1.rpc.{tenant}.groups`. */
  groupsRpc(tenant: string): string;
  /** Wildcard over every tenant's groups requests. */
  readonly allGroupsRpc: string;
  /** Reads the tenant token back from a request-reply subject; undefined unless a token. */
  parseRpcTenant(subject: string): string | undefined;
  /** Reads the kind (`result`, `progress`, `schema`) back from a session event subject. */
  sessionEventKind(subject: string): string | undefined;
  /** Reads the session token back from a session event subject. */
  sessionOfEvent(subject: string): string | undefined;
  /**
   * Reads the session address back from a call or cancel subject; undefined when the subject
   * has another shape or a token that {@link subjectToken} cannot produce (a literal `*`).
   */
  parseSessionSubject(subject: string): SessionAddress | undefined;
  /** JetStream stream names. */
  readonly streams: {
    readonly calls: string;
    readonly work: string;
    readonly sessions: string;
    readonly events: string;
    readonly dlq: string;
    /** Keeps the server's max-deliveries advisories of the calls, work and owners' work streams. */
    readonly advisories: string;
  };
  /** KV bucket holding the tool registry. */
  readonly registryBucket: string;
  /** KV bucket holding the record of every accepted call. */
  readonly callsBucket: string;
  /**
   * KV bucket (with a TTL) holding per-session state: what the schema expander sent and the
   * session's policy (group overrides, bound agent). Keys from {@link Subjects.sessionStateKey}.
   */
  readonly sessionsBucket: string;
  /** KV bucket holding each tenant's tool-group switches; key = tenant token. */
  readonly groupsBucket: string;
  /** KV bucket holding the approved (pinned) tool definitions of MCP servers; key = server name. */
  readonly toolApprovalsBucket: string;
  /** KV bucket holding the quotas; keys from `quotaKey` (`{tenant}`, `{tenant}.tool.{tool}`, `{tenant}.agent.{agent}`). */
  readonly quotasBucket: string;
  /** KV bucket holding what each quota scope uses (calls in flight, tokens, the day's count); same keys. */
  readonly quotaUsageBucket: string;
  /**
   * KV bucket holding users' secrets for tools, sealed (AES-256-GCM); keys from
   * {@link Subjects.userSecretKey}.
   */
  readonly userSecretsBucket: string;
  /** Key of one user's secret for one tool: `{tenant}.{subject}.{tool}`, each a subject token. */
  userSecretKey(tenant: string, subject: string, tool: string): string;
  /**
   * Key of the delegation grant of one call in {@link Subjects.userSecretsBucket}, sealed:
   * `{tenant}.{subject}.{audience}.grant.{call}` (five tokens: never a user secret's key).
   */
  delegationGrantKey(tenant: string, subject: string, audience: string, call: string): string;
  /**
   * Key of one user's cached access token for one audience in
   * {@link Subjects.userSecretsBucket}, sealed: `{tenant}.{subject}.{audience}.token`.
   */
  delegatedTokenKey(tenant: string, subject: string, audience: string): string;
  /**
   * Where the gateway hands a call's delegation grant to the executors that serve its tool:
   * `{p}.v1.delegation.mesh`, or `{p}.v1.delegation.owner.{owner}`, exported by that owner's
   * account to the mesh alone.
   */
  delegationDeposit(owner?: string): string;
  /** KV bucket holding the Cedar policy sets: key `operator`, or `tenant.{tenant}` (docs/policy.md). */
  readonly policiesBucket: string;
  /** KV bucket holding calls that wait for approval, by call key (ADR 0059). */
  readonly callApprovalsBucket: string;
  /**
   * Key of one part of a session's state in {@link Subjects.sessionsBucket}:
   * `{tenant}.{session}.{part}`, part `schemas` (expansion) or `policy` (groups, agent).
   */
  sessionStateKey(at: SessionAddress, part: "schemas" | "policy"): string;
  /** Key filter matching the `policy` part of every session. */
  readonly allSessionPolicies: string;
  /** Durable consumer of the schema expanders on the events stream, shared by replicas. */
  readonly schemaExpanderConsumer: string;
  /** Durable consumer of the dead-letter keeper on the advisories stream. */
  readonly deadLetterConsumer: string;
  /**
   * Durable consumer of the resolvers on the sessions stream's final messages, each recorded as
   * its call's end in the audit trail (ADR 0068).
   */
  readonly auditEndsConsumer: string;
  /** Durable consumer name for one tool's work, shared by every executor of the tool. */
  workConsumer(tool: string): string;
  /** Durable consumer name of the resolver on the calls stream. */
  readonly resolverConsumer: string;
  /** Core request answered by every toolmesh process with its metrics: `{p}.v1.control.stats`. */
  readonly stats: string;
  /** Wildcard over every session event of one tenant: `{p}.v1.sessions.{tenant}.*.>`. */
  tenantEvents(tenant: string): string;
  /** Wildcard over every call of one tenant: `{p}.v1.calls.{tenant}.*`. */
  tenantCalls(tenant: string): string;
  /**
   * Key of a tool in {@link Subjects.registryBucket}: the token of its name, or for a name
   * `ns.rest` (an MCP tool `server.tool`) the token of `ns`, a dot and the token of `rest`, so
   * NATS permissions can give one owner a whole namespace (`$KV.{bucket}.{ns}.*`).
   */
  registryKey(name: string): string;
  /**
   * Inbox prefix of a service role (`_INBOX.{p}.{role}`): replies to its requests (JetStream
   * API, pull deliveries) arrive below it, so permissions can keep other roles from them.
   */
  inboxPrefix(role: string): string;
  /**
   * A service the mesh offers tool owner `owner` (ADR 0031): `{p}.v1.owner.{owner}.{service}`.
   * The mesh takes the owner from the subject, so an owner's account, importing only its own
   * `{p}.v1.owner.{owner}.>`, can act for no other owner.
   */
  ownerService(owner: string, service: OwnerService): string;
  /** Wildcard over every owner service of every owner (the resolver's subscription). */
  readonly allOwnerServices: string;
  /**
   * Where the executors of tool owner `owner` announce their capacity (ADR 0055), a core
   * broadcast every resolver hears: `{p}.v1.owner.{owner}.capacity`. Crossing through the
   * owner's own import, it can speak for no other owner.
   */
  ownerCapacity(owner: string): string;
  /** Wildcard over every owner's capacity announcements: `{p}.v1.owner.*.capacity`. */
  readonly allOwnerCapacity: string;
  /**
   * Where tool owner `owner` registers tool `name`: `{p}.v1.owner.{owner}.register.{key}`, `key`
   * being the name's {@link Subjects.registryKey}. The name is in the subject so that the
   * owner's account can be given the names it may register, and no other (ADR 0041).
   */
  ownerRegister(owner: string, name: string): string;
  /**
   * Reads the owner token and service back from an owner-service subject, and for `register`
   * the registry key it names (absent from a bare `….register`).
   */
  parseOwnerSubject(
    subject: string,
  ): { owner: string; service: OwnerService; key?: string } | undefined;
  /**
   * JetStream API prefix of an executor or bridge in an owner's account: the mesh's consumer
   * API crossings are imported below it (`{p}.js.API`), since an account without JetStream
   * answers `$JS.API.>` itself.
   */
  readonly ownerJsApiPrefix: string;
  /**
   * Inbox prefix of an executor or bridge of tool owner `owner`
   * (`_INBOX.{p}.{role}.{owner}`), so no owner reads another's pull deliveries.
   */
  ownerInboxPrefix(role: "executor" | "mcp-bridge", owner: string): string;
  /**
   * Inbox prefix of a frontend of `tenant` (`_INBOX.{p}.frontend.{tenant}`), or of a frontend
   * confined to one session (`….{session}`). Services answer requests only below
   * `_INBOX.{p}.frontend.>` and `_INBOX.{p}.operator.>`.
   */
  frontendInboxPrefix(tenant: string, session?: string): string;
  /** Inbox prefix of tenant `tenant`'s approver: `_INBOX.{p}.approver.{tenant}` (ADR 0059). */
  approverInboxPrefix(tenant: string): string;
}

// Lower case and no `_`: stream and bucket names join the parts with `_` and upper-case
// them, and distinct prefixes must never share streams.
const PREFIX_PART = /^[a-z0-9-]+$/;

/** Validates a prefix; throws `invalid_request` naming the offending part. */
export function assertValidPrefix(prefix: string): void {
  const parts = prefix.split(".");
  for (const part of parts) {
    if (!PREFIX_PART.test(part)) {
      throw new ToolmeshError(
        ErrorCode.InvalidRequest,
        `invalid subject prefix "${prefix}": part "${part}" must match [a-z0-9-]+`,
      );
    }
  }
}

/** Builds every subject, stream and bucket name for a prefix. The only place subjects are made. */
// eslint-disable-next-line max-lines-per-function -- a declarative table: one subject, stream or bucket name a line, the whole grammar in one place
export function createSubjects(options: SubjectOptions = {}): Subjects {
  const prefix = options.prefix ?? Defaults.prefix;
  assertValidPrefix(prefix);
  const base = `${prefix}.${PROTOCOL_VERSION}`;
  const t = subjectToken;
  const stem = prefix.replace(/\./g, "_").toUpperCase();
  const bucketStem = prefix.replace(/\./g, "_").toLowerCase();
  const baseParts = base.split(".").length;
  const registryKey = (name: string): string => {
    const dot = name.indexOf(".");
    if (dot <= 0 || dot === name.length - 1) return t(name);
    return `${t(name.slice(0, dot))}.${t(name.slice(dot + 1))}`;
  };

  return {
    prefix,
    address: (tenant, session) => ({ tenant: t(tenant), session: t(session) }),
    call: (at) => `${base}.calls.${at.tenant}.${at.session}`,
    allCalls: `${base}.calls.*.*`,
    tenantStreamCall: (at) => `${base}.tenant-calls.${at.tenant}.${at.session}`,
    tenantStreamCalls: (tenant) => `${base}.tenant-calls.${t(tenant)}.*`,
    allTenantStreamCalls: `${base}.tenant-calls.*.*`,
    callsStream: (tenant) =>
      tenant === undefined ? `${stem}_CALLS` : `${stem}_CALLS_${t(tenant)}`,
    isCallsStream: (stream) => stream === `${stem}_CALLS` || stream.startsWith(`${stem}_CALLS_`),
    auditStream: (tenant) => `${stem}_AUDIT_${tenant}`,
    audit: (tenant) => `${base}.audit.${tenant}`,
    auditWrite: (tenant) => `${base}.audit-write.${tenant}`,
    allAuditWrites: `${base}.audit-write.*`,
    intake: `${base}.intake`,
    cancel: (at) => `${base}.cancel.${at.tenant}.${at.session}`,
    allCancel: `${base}.cancel.*.*`,
    abort: `${base}.control.abort`,
    ownerAbort: (owner) => `${base}.control.abort.${t(owner)}`,
    abortOf: (stream) =>
      stream.startsWith(`${stem}_WORK_`)
        ? `${base}.control.abort.${stream.slice(stem.length + 6)}`
        : `${base}.control.abort`,
    dlq: (tool) => `${base}.dlq.${t(tool)}`,
    allDlq: `${base}.dlq.*`,
    maxDeliveriesAdvisory: (stream) => `$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.${stream}.*`,
    work: (tool, owner) =>
      owner === undefined ? `${base}.work.${t(tool)}` : `${base}.work.${t(owner)}.${t(tool)}`,
    allWork: `${base}.work.*`,
    allOwnerWork: `${base}.work.*.*`,
    ownerWork: (owner) => `${base}.work.${t(owner)}.*`,
    workStream: (owner) => (owner === undefined ? `${stem}_WORK` : `${stem}_WORK_${t(owner)}`),
    workStreamOf(subject) {
      const parts = subject.split(".");
      if (parts[baseParts] !== "work" || !subject.startsWith(`${base}.`)) return undefined;
      if (parts.length === baseParts + 2) return `${stem}_WORK`;
      const owner = parts[baseParts + 1];
      return parts.length === baseParts + 3 && isSubjectToken(owner)
        ? `${stem}_WORK_${owner}`
        : undefined;
    },
    isWorkStream: (stream) => stream === `${stem}_WORK` || stream.startsWith(`${stem}_WORK_`),
    workHeads: (owner) =>
      owner === undefined
        ? `${base}.heads.work.{{wildcard(1)}}`
        : `${base}.heads.work.${t(owner)}.{{wildcard(1)}}`,
    allWorkHeads: `${base}.heads.work.>`,
    resultHeads: `${base}.heads.result.{{wildcard(1)}}.{{wildcard(2)}}.{{wildcard(3)}}`,
    allResultHeads: `${base}.heads.result.>`,
    sessionEvents: (at) => `${base}.sessions.${at.tenant}.${at.session}.>`,
    result: (at, callId) => `${base}.sessions.${at.tenant}.${at.session}.result.${t(callId)}`,
    rejected: (at, seq) => `${base}.sessions.${at.tenant}.${at.session}.rejected.${seq}`,
    progress: (at, callId) => `${base}.sessions.${at.tenant}.${at.session}.progress.${t(callId)}`,
    schema: (at, tool) => `${base}.sessions.${at.tenant}.${at.session}.schema.${t(tool)}`,
    approvalRequired: (at, callId) =>
      `${base}.sessions.${at.tenant}.${at.session}.approval.${t(callId)}`,
    approvalsRpc: (tenant) => `${base}.approvals.${t(tenant)}`,
    allApprovalsRpc: `${base}.approvals.*`,
    confirm: (at) => `${base}.confirm.${at.tenant}.${at.session}`,
    allConfirm: `${base}.confirm.*.*`,
    storedSessionEvents: [
      `${base}.sessions.*.*.result.*`,
      `${base}.sessions.*.*.schema.*`,
      `${base}.sessions.*.*.rejected.*`,
    ],
    missingArguments: (at, tool) => `${base}.events.missing.${at.tenant}.${t(tool)}`,
    allEvents: `${base}.events.>`,
    allMissingArguments: `${base}.events.missing.>`,
    resolveRpc: (tenant) => `${base}.rpc.${t(tenant)}.resolve`,
    allResolveRpc: `${base}.rpc.*.resolve`,
    catalogRpc: (tenant) => `${base}.rpc.${t(tenant)}.catalog`,
    allCatalogRpc: `${base}.rpc.*.catalog`,
    describeRpc: (tenant) => `${base}.rpc.${t(tenant)}.describe`,
    allDescribeRpc: `${base}.rpc.*.describe`,
    expandRpc: (tenant) => `${base}.rpc.${t(tenant)}.expand`,
    allExpandRpc: `${base}.rpc.*.expand`,
    groupsRpc: (tenant) => `${base}.rpc.${t(tenant)}.groups`,
    allGroupsRpc: `${base}.rpc.*.groups`,
    parseRpcTenant(subject) {
      const tenant = subject.split(".")[baseParts + 1];
      return isSubjectToken(tenant) ? tenant : undefined;
    },
    sessionEventKind: (subject) => subject.split(".")[baseParts + 3],
    sessionOfEvent: (subject) => subject.split(".")[baseParts + 2],
    allResults: `${base}.sessions.*.*.result.*`,
    parseResultSubject(subject) {
      const parts = subject.split(".");
      const [tenant, session, kind, call] = parts.slice(baseParts + 1);
      if (parts.length !== baseParts + 5 || kind !== "result") return undefined;
      if (tenant === undefined || session === undefined || call === undefined) return undefined;
      return { address: { tenant, session }, call };
    },
    parseSessionSubject(subject) {
      const parts = subject.split(".");
      if (parts.length !== baseParts + 3) return undefined;
      const tenant = parts[baseParts + 1];
      const session = parts[baseParts + 2];
      if (!isSubjectToken(tenant) || !isSubjectToken(session)) return undefined;
      return { tenant, session };
    },
    streams: {
      calls: `${stem}_CALLS`,
      work: `${stem}_WORK`,
      sessions: `${stem}_SESSIONS`,
      events: `${stem}_EVENTS`,
      dlq: `${stem}_DLQ`,
      advisories: `${stem}_ADVISORIES`,
    },
    registryBucket: `${bucketStem}_tools`,
    callsBucket: `${bucketStem}_calls`,
    sessionsBucket: `${bucketStem}_sessions`,
    groupsBucket: `${bucketStem}_groups`,
    toolApprovalsBucket: `${bucketStem}_tool_approvals`,
    quotasBucket: `${bucketStem}_quotas`,
    quotaUsageBucket: `${bucketStem}_quota_usage`,
    userSecretsBucket: `${bucketStem}_user_secrets`,
    userSecretKey: (tenant, subject, tool) =>
      `${subjectToken(tenant)}.${subjectToken(subject)}.${subjectToken(tool)}`,
    delegationGrantKey: (tenant, subject, audience, call) =>
      `${subjectToken(tenant)}.${subjectToken(subject)}.${subjectToken(audience)}.grant.${subjectToken(call)}`,
    delegatedTokenKey: (tenant, subject, audience) =>
      `${subjectToken(tenant)}.${subjectToken(subject)}.${subjectToken(audience)}.token`,
    delegationDeposit: (owner) =>
      owner === undefined ? `${base}.delegation.mesh` : `${base}.delegation.owner.${t(owner)}`,
    policiesBucket: `${bucketStem}_policies`,
    callApprovalsBucket: `${bucketStem}_call_approvals`,
    sessionStateKey: (at, part) => `${at.tenant}.${at.session}.${part}`,
    allSessionPolicies: "*.*.policy",
    schemaExpanderConsumer: "schema_expander",
    deadLetterConsumer: "dead_letter_keeper",
    auditEndsConsumer: "audit_ends",
    workConsumer: (tool) => `work_${t(tool)}`,
    resolverConsumer: "resolver",
    stats: `${base}.control.stats`,
    tenantEvents: (tenant) => `${base}.sessions.${t(tenant)}.*.>`,
    tenantCalls: (tenant) => `${base}.calls.${t(tenant)}.*`,
    registryKey,
    inboxPrefix: (role) => `_INBOX.${prefix}.${t(role)}`,
    ownerService: (owner, service) => `${base}.owner.${t(owner)}.${service}`,
    allOwnerServices: `${base}.owner.*.>`,
    ownerCapacity: (owner) => `${base}.owner.${t(owner)}.capacity`,
    allOwnerCapacity: `${base}.owner.*.capacity`,
    ownerRegister: (owner, name) => `${base}.owner.${t(owner)}.register.${registryKey(name)}`,
    parseOwnerSubject(subject) {
      const parts = subject.split(".");
      if (parts.length < baseParts + 3 || parts[baseParts] !== "owner") return undefined;
      const owner = parts[baseParts + 1];
      const service = OWNER_SERVICES.find((s) => s === parts[baseParts + 2]);
      if (!isSubjectToken(owner) || service === undefined) return undefined;
      const key = parts.slice(baseParts + 3);
      if (key.length === 0) return { owner, service };
      if (service !== "register" || key.length > 2 || !key.every(isSubjectToken)) return undefined;
      return { owner, service, key: key.join(".") };
    },
    ownerJsApiPrefix: `${prefix}.js.API`,
    ownerInboxPrefix: (role, owner) => `_INBOX.${prefix}.${role}.${t(owner)}`,
    frontendInboxPrefix: (tenant, session) =>
      `_INBOX.${prefix}.frontend.${t(tenant)}${session === undefined ? "" : `.${t(session)}`}`,
    approverInboxPrefix: (tenant) => `_INBOX.${prefix}.approver.${t(tenant)}`,
  };
}
