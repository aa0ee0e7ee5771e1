import type { Subjects } from "@toolmesh/protocol";
import {
  ErrorCode,
  STREAM_LEADER_ELECTED_ADVISORIES,
  ToolmeshError,
  consumerLeaderElectedAdvisory,
  createSubjects,
  subjectToken,
} from "@toolmesh/protocol";
import { obsoleteStreams } from "./mesh-plan.js";

/** The NATS users of a mesh, one per role (docs/security.md). */
export const PERMISSION_ROLES = [
  "frontend",
  "approver",
  "resolver",
  "gateway",
  "executor",
  "mcp-bridge",
  "schema-expander",
  "operator",
  "setup",
] as const;

/** One of {@link PERMISSION_ROLES}. */
export type PermissionRole = (typeof PERMISSION_ROLES)[number];

/** What a role's permissions are computed for. */
export interface PermissionOptions {
  /** Subject prefix. Default `toolmesh`. */
  prefix?: string;
  /** `frontend`, `approver`: the tenant id it is confined to (required). */
  tenant?: string;
  /**
   * `executor`, `mcp-bridge`: the tool owner whose account it lives in (ADR 0031): its rights are
   * then the owner's crossings into the mesh. Without it, an executor or bridge inside the mesh
   * account, trusted like a service.
   */
  owner?: string;
  /** `frontend`: confine it further to this one session. */
  session?: string;
  /**
   * `executor`: the tool names it may register (its registry keys); `ns.*` stands for every
   * tool of namespace `ns`. Default any tool name (ownership then rests on first-wins alone).
   * With `owner` (executor or mcp-bridge): names granted to the owner beyond its own namespace
   * `{owner}.*`, which its account's imports carry (ADR 0041); its user's rights are the same.
   */
  tools?: readonly string[];
  /**
   * `resolver`, `operator`, `setup`: the tool owners with accounts, whose work streams
   * (`{P}_WORK_{owner}`) these roles manage and read. Default none.
   */
  owners?: readonly string[];
  /**
   * `resolver`, `operator`, `setup`: the tenants with accounts, whose calls streams
   * (`{P}_CALLS_{tenant}`, ADR 0048) these roles manage and read. Default none.
   */
  tenants?: readonly string[];
  /** `mcp-bridge`: the MCP server names it serves (tools `{server}.*`). Default any. */
  servers?: readonly string[];
}

/** A nats-server `permissions` block: subjects a user may publish to and subscribe to. */
export interface Permissions {
  publish: { allow: string[] };
  subscribe: { allow: string[] };
}

function bad(message: string): never {
  throw new ToolmeshError(ErrorCode.InvalidRequest, message, { retryable: false });
}

/** Names toolmesh derives from the prefix, as the permissions need them. */
function names(s: Subjects) {
  const base = `${s.prefix}.v1`;
  const kv = (bucket: string) => `KV_${bucket}`;
  return {
    base,
    streams: Object.values(s.streams),
    buckets: [
      s.registryBucket,
      s.callsBucket,
      s.sessionsBucket,
      s.groupsBucket,
      s.quotasBucket,
      s.quotaUsageBucket,
      s.policiesBucket,
      s.callApprovalsBucket,
      s.userSecretsBucket,
    ],
    kv,
    /**
     * Replies to requests of the operator and the gateway (in the mesh account), and of tenants:
     * a request that crossed a service import carries a `_R_.…` reply the server maps back.
     */
    replies: [
      `_INBOX.${s.prefix}.operator.>`,
      `_INBOX.${s.prefix}.gateway.>`,
      `_INBOX.${s.prefix}.frontend.>`,
      "_R_.>",
    ],
  };
}

const API = "$JS.API";

/** The versioned subject base `{p}.v1`. */
function n0(s: Subjects): string {
  return `${s.prefix}.v1`;
}

/** The MCP bridge's bucket of approved tool definitions (`{p}_tool_approvals`, ADR 0014). */
function approvalsBucket(s: Subjects): string {
  return s.toolApprovalsBucket;
}

/** JetStream API and KV subjects to read a bucket and watch it (ordered consumers). */
function bucketRead(bucket: string): string[] {
  const stream = `KV_${bucket}`;
  return [
    `${API}.STREAM.INFO.${stream}`,
    `${API}.STREAM.MSG.GET.${stream}`,
    `${API}.DIRECT.GET.${stream}.>`,
    ...orderedReader(stream),
  ];
}

/**
 * What sets, lists and removes users' secrets (`toolmesh secrets`, ADR 0061): the JetStream
 * account info, and creating, reading and writing the bucket `{p}_user_secrets` of the account
 * it connects to.
 */
function userSecretsWriter(s: Subjects): string[] {
  const bucket = s.userSecretsBucket;
  return [
    `${API}.INFO`,
    `${API}.STREAM.CREATE.KV_${bucket}`,
    ...bucketRead(bucket),
    `$KV.${bucket}.>`,
  ];
}

/**
 * What every service needs: its inbox, JetStream account info and stream/bucket info, and the
 * stats request of operators (answered to the operator's inbox).
 */
function serviceBase(s: Subjects, role: string): Permissions {
  const n = names(s);
  return {
    publish: {
      allow: [
        `${API}.INFO`,
        ...n.streams.map((st) => `${API}.STREAM.INFO.${st}`),
        ...bucketRead(s.registryBucket),
        `_INBOX.${s.prefix}.operator.>`,
      ],
    },
    // Leader elections: a service retries what a lost leader took, and pulls from a new one.
    subscribe: { allow: [`${s.inboxPrefix(role)}.>`, s.stats, ...LEADER_ELECTED] },
  };
}

/** JetStream's leader-election advisories (stream and consumer names, no call data). */
const LEADER_ELECTED = [STREAM_LEADER_ELECTED_ADVISORIES, consumerLeaderElectedAdvisory("*", "*")];

/** A durable pull consumer the role reads: info, create when missing, next, acks. */
function durable(stream: string, consumer: string): string[] {
  return [
    `${API}.CONSUMER.INFO.${stream}.${consumer}`,
    `${API}.CONSUMER.CREATE.${stream}.${consumer}`,
    `${API}.CONSUMER.CREATE.${stream}.${consumer}.>`,
    `${API}.CONSUMER.DURABLE.CREATE.${stream}.${consumer}`,
    `${API}.CONSUMER.MSG.NEXT.${stream}.${consumer}`,
    `$JS.ACK.${stream}.${consumer}.>`,
  ];
}

/** An ordered (ephemeral, unacknowledged) reader of a stream. */
function orderedReader(stream: string): string[] {
  return [
    `${API}.CONSUMER.CREATE.${stream}`,
    `${API}.CONSUMER.CREATE.${stream}.>`,
    `${API}.CONSUMER.DELETE.${stream}.>`,
    `${API}.CONSUMER.INFO.${stream}.>`,
    `${API}.CONSUMER.MSG.NEXT.${stream}.>`,
    `$JS.FC.${stream}.>`,
  ];
}

function merge(...parts: Permissions[]): Permissions {
  const unique = (lists: string[][]) => [...new Set(lists.flat())];
  return {
    publish: { allow: unique(parts.map((p) => p.publish.allow)) },
    subscribe: { allow: unique(parts.map((p) => p.subscribe.allow)) },
  };
}

function pub(...allow: string[]): Permissions {
  return { publish: { allow }, subscribe: { allow: [] } };
}

function sub(...allow: string[]): Permissions {
  return { publish: { allow: [] }, subscribe: { allow } };
}

/** Registry keys an owner may write: its tool names, or `ns.*` namespaces; default all. */
function registryWrites(s: Subjects, tools: readonly string[] | undefined): string[] {
  if (tools === undefined || tools.length === 0) return [`$KV.${s.registryBucket}.>`];
  return tools.map((name) => {
    if (name.endsWith(".*") && name.length > 2) {
      const namespace = name.slice(0, -2);
      if (namespace.includes(".")) bad(`tool namespace "${namespace}" must not contain a dot`);
      return `$KV.${s.registryBucket}.${subjectToken(namespace)}.*`;
    }
    return `$KV.${s.registryBucket}.${s.registryKey(name)}`;
  });
}

/** Work consumers an executor may read: those of its tools, or every one. */
function workConsumers(s: Subjects, tools: readonly string[] | undefined): string[] {
  const exact = tools?.filter((t) => !t.endsWith(".*"));
  if (tools === undefined || tools.length === 0 || exact?.length !== tools.length) {
    return durable(s.streams.work, "*");
  }
  return exact.flatMap((tool) => durable(s.streams.work, s.workConsumer(tool)));
}

/** A tool host (executor or MCP bridge): its work, its registry keys, call records, results. */
function toolHost(s: Subjects, role: string, tools: readonly string[] | undefined): Permissions {
  const n = names(s);
  return merge(
    serviceBase(s, role),
    sub(s.abort),
    pub(
      `${n.base}.sessions.*.*.result.*`,
      `${n.base}.sessions.*.*.progress.*`,
      `${n.base}.dlq.*`,
      // Its capacity, announced under the owner it registers its tools as (ADR 0055).
      s.allOwnerCapacity,
      ...workConsumers(s, tools),
      `${API}.STREAM.MSG.GET.${s.streams.sessions}`,
      ...bucketRead(s.callsBucket),
      `$KV.${s.callsBucket}.>`,
      ...registryWrites(s, tools),
    ),
  );
}

/** What a mesh-account role's rights are computed from. */
interface RoleContext {
  s: Subjects;
  role: PermissionRole;
  n: ReturnType<typeof names>;
  options: PermissionOptions;
  /** Work streams of the owners with accounts. */
  ownerStreams: string[];
  /** Calls streams of the tenants with accounts. */
  tenantStreams: string[];
  /** Audit trails of the tenants with accounts (ADR 0060). */
  auditStreams: string[];
  /** What the resolvers write into the audit trails: events, and each tail read. */
  auditWrites: string[];
}

/** A tenant's frontend: its own call, cancel and RPC subjects, sessions and inbox. */
function frontendPermissions({ s, n, options }: RoleContext): Permissions {
  if (options.tenant === undefined) bad("the frontend role needs --tenant <id>");
  const t = subjectToken(options.tenant);
  const session = options.session === undefined ? "*" : subjectToken(options.session);
  return {
    publish: {
      allow: [
        `${n.base}.calls.${t}.${session}`,
        `${n.base}.cancel.${t}.${session}`,
        `${n.base}.confirm.${t}.${session}`,
        `${n.base}.rpc.${t}.*`,
        `${API}.DIRECT.GET.${s.streams.sessions}.${n.base}.sessions.${t}.${session}.>`,
      ],
    },
    subscribe: {
      allow: [
        `${n.base}.sessions.${t}.${session}.>`,
        `${s.frontendInboxPrefix(options.tenant, options.session)}.>`,
        // A submission a lost leader took is sent again once a new one is elected.
        STREAM_LEADER_ELECTED_ADVISORIES,
      ],
    },
  };
}

/** The tenant's approver (ADR 0059): lists and decides its tenant's waiting calls through the resolvers, nothing else; its account's import reaches its own tenant only. */
function approverPermissions({ s, options }: RoleContext): Permissions {
  if (options.tenant === undefined) bad("the approver role needs --tenant <id>");
  return {
    // Its tenant's calls waiting for approval, and its tenant's audit trail (read only).
    publish: { allow: [s.approvalsRpc(options.tenant), ...auditReads(s, options.tenant)] },
    subscribe: { allow: [`${s.approverInboxPrefix(options.tenant)}.>`] },
  };
}

/** The resolver: routes calls to work, keeps deadlines, reconciles and dead-letters. */
function resolverPermissions({
  s,
  n,
  role,
  ownerStreams,
  tenantStreams,
  auditWrites,
}: RoleContext): Permissions {
  return merge(
    serviceBase(s, role),
    // The deadline keeper follows work and results as the streams store them: their headers,
    // which the streams republish (ADR 0066), or the stored subjects themselves.
    sub(
      s.allCancel,
      s.allResolveRpc,
      // Approvals: the approvers' and operator's requests, and callers' confirmations.
      s.allApprovalsRpc,
      s.allConfirm,
      s.allWorkHeads,
      s.allResultHeads,
      s.allWork,
      s.allResults,
      s.allOwnerServices,
      // Owners' work too, though none has an account yet: the deadline keeper follows every
      // owner's work stream, whichever are made later.
      s.allOwnerWork,
      // Every tenant's own calls stream pushes to the resolvers' queue group (ADR 0048).
      s.intake,
    ),
    auditChainer(s, auditWrites),
    pub(
      ...n.replies,
      s.allWork,
      ...ownerStreamRights(s, ownerStreams),
      // Reconciliation and dead letters find owners' and tenants' streams by listing them.
      `${API}.STREAM.NAMES`,
      ...tenantStreams.flatMap((st) => [
        `$JS.ACK.${st}.${s.resolverConsumer}.>`,
        `${API}.CONSUMER.INFO.${st}.${s.resolverConsumer}`,
        ...["INFO", "MSG.GET", "MSG.DELETE"].map((op) => `${API}.STREAM.${op}.${st}`),
        `${API}.CONSUMER.LIST.${st}`,
      ]),
      `${n.base}.sessions.*.*.result.*`,
      // The owner services: progress relayed for an owner's executor, registry entries filed
      // under their owner, and each registered tool's work consumer.
      `${n.base}.sessions.*.*.progress.*`,
      `$KV.${s.registryBucket}.>`,
      ...["INFO", "CREATE", "DURABLE.CREATE"].map(
        (op) => `${API}.CONSUMER.${op}.${s.streams.work}.*`,
      ),
      `${API}.CONSUMER.CREATE.${s.streams.work}.*.>`,
      `${n.base}.sessions.*.*.rejected.*`,
      s.allMissingArguments.replace(/>$/, "*.*"),
      s.abort,
      `${s.abort}.*`,
      s.allDlq,
      ...durable(s.streams.calls, s.resolverConsumer),
      ...durable(s.streams.advisories, s.deadLetterConsumer),
      ...[s.streams.sessions, s.streams.calls, s.streams.work, s.streams.advisories].map(
        (st) => `${API}.STREAM.MSG.GET.${st}`,
      ),
      ...[s.streams.calls, s.streams.work, s.streams.advisories].map(
        (st) => `${API}.STREAM.MSG.DELETE.${st}`,
      ),
      // Reconciliation reads each consumer's ack floor.
      ...[s.streams.calls, s.streams.work].map((st) => `${API}.CONSUMER.LIST.${st}`),
      ...bucketRead(s.callsBucket),
      `$KV.${s.callsBucket}.>`,
      ...bucketRead(s.groupsBucket),
      ...bucketRead(s.sessionsBucket),
      // Quotas: watched, and their usage kept by compare-and-set; fair share reads how much
      // work waits for each busy tool.
      ...bucketRead(s.quotasBucket),
      ...bucketRead(s.quotaUsageBucket),
      `$KV.${s.quotaUsageBucket}.>`,
      `${API}.CONSUMER.INFO.${s.streams.work}.>`,
      // Policy sets: watched, never written.
      ...bucketRead(s.policiesBucket),
      // Calls waiting for approval, kept by compare-and-set; their sessions are told.
      ...bucketRead(s.callApprovalsBucket),
      `$KV.${s.callApprovalsBucket}.>`,
      `${n.base}.sessions.*.*.approval.*`,
    ),
  );
}

/**
 * The resolver's part in the tenants' audit trails (ADR 0060, ADR 0064): it writes them and
 * reads their tails, and takes the events executors and MCP bridges hand on, answering on
 * their inboxes.
 */
function auditChainer(s: Subjects, auditWrites: string[]): Permissions {
  return merge(
    sub(s.allAuditWrites),
    pub(
      `_INBOX.${s.prefix}.executor.>`,
      `_INBOX.${s.prefix}.mcp-bridge.>`,
      ...auditWrites,
      // Each final message the sessions stream stores is recorded as its call's end (ADR 0068).
      ...durable(s.streams.sessions, s.auditEndsConsumer),
    ),
  );
}

/**
 * Each owner's work stream (ADR 0041), as the resolver keeps it: created and kept like the
 * mesh's, its work routed, watched for deadlines, reconciled and dead-lettered.
 */
function ownerStreamRights(s: Subjects, ownerStreams: string[]): string[] {
  if (ownerStreams.length === 0) return [];
  return [
    s.allOwnerWork,
    // Adds each owner's max-deliveries advisories to the advisories stream.
    `${API}.STREAM.UPDATE.${s.streams.advisories}`,
    ...ownerStreams.flatMap((st) => [
      ...["INFO", "CREATE", "UPDATE", "MSG.GET", "MSG.DELETE"].map(
        (op) => `${API}.STREAM.${op}.${st}`,
      ),
      ...["INFO", "CREATE", "DURABLE.CREATE"].map((op) => `${API}.CONSUMER.${op}.${st}.*`),
      `${API}.CONSUMER.CREATE.${st}.*.>`,
      `${API}.CONSUMER.LIST.${st}`,
    ]),
  ];
}

/** The MCP gateway: submits and follows calls for every tenant it authenticates. */
function gatewayPermissions({ s, n, role }: RoleContext): Permissions {
  return merge(
    serviceBase(s, role),
    sub(`${n.base}.sessions.>`),
    pub(
      s.allCalls,
      // A tenant with a calls stream of its own has its calls stored there (ADR 0048); the
      // gateway lists streams to learn which tenants have one.
      s.allTenantStreamCalls,
      `${API}.STREAM.NAMES`,
      `${n.base}.cancel.*.*`,
      // A caller's answer to `input_required` for a call that waits for it (ADR 0059).
      `${n.base}.confirm.*.*`,
      `${n.base}.rpc.*.*`,
      // Calls' delegation grants, handed to the executors of their tools (ADR 0063).
      `${n.base}.delegation.>`,
      `${API}.DIRECT.GET.${s.streams.sessions}.${n.base}.sessions.>`,
      // Tasks are read from the call records, and from the calls waiting for approval (never
      // written: decisions go through the confirm subject); catalogs follow groups and sessions.
      ...bucketRead(s.callsBucket),
      ...bucketRead(s.callApprovalsBucket),
      ...bucketRead(s.groupsBucket),
      ...bucketRead(s.sessionsBucket),
      // Mesh-wide per-credential limits: the gateway's own keys of the quota usage bucket.
      `${API}.STREAM.INFO.KV_${s.quotaUsageBucket}`,
      `${API}.DIRECT.GET.KV_${s.quotaUsageBucket}.$KV.${s.quotaUsageBucket}.gateway.>`,
      `$KV.${s.quotaUsageBucket}.gateway.>`,
    ),
  );
}

/** An executor in the mesh account, trusted like a service. */
function executorPermissions({ s, role, options }: RoleContext): Permissions {
  // Users' secrets of its tools that act as their caller (ADR 0061), sealed.
  return merge(
    toolHost(s, role, options.tools),
    // Hands its attempts and calls' ends to the resolvers, which chain them (ADR 0064).
    pub(s.allAuditWrites, ...bucketRead(s.userSecretsBucket)),
    delegationHolder(s, s.delegationDeposit(), `_INBOX.${s.prefix}.gateway.>`),
  );
}

/**
 * What an executor of `token-exchange` tools needs of deferred delegation (ADR 0063): the
 * gateway's deposits on `deposits`, answered on `replies`, and writing the calls' grants and
 * the cached tokens in the bucket of users' secrets of its account (never a user secret: those
 * keys have three tokens).
 */
function delegationHolder(s: Subjects, deposits: string, replies: string): Permissions {
  const kv = `$KV.${s.userSecretsBucket}`;
  return merge(sub(deposits), pub(replies, `${kv}.*.*.*.grant.*`, `${kv}.*.*.*.token`));
}

/** An MCP bridge in the mesh account, with the approvals bucket of its servers. */
function bridgePermissions({ s, role, options }: RoleContext): Permissions {
  // Approved (pinned) tool definitions, one key per server; `toolmesh setup` provisions the
  // bucket, and a bridge allowed to creates it when it first pins.
  const approvals = approvalsBucket(s);
  return merge(
    toolHost(
      s,
      role,
      options.servers?.map((server) => `${server}.*`),
    ),
    // Its servers' tools may act as their callers, as an executor's (ADR 0061, ADR 0063); it
    // hands their calls' attempts and ends to the resolvers, as an executor does (ADR 0064).
    pub(s.allAuditWrites, ...bucketRead(s.userSecretsBucket)),
    delegationHolder(s, s.delegationDeposit(), `_INBOX.${s.prefix}.gateway.>`),
    pub(
      ...bucketRead(approvals),
      `${API}.STREAM.CREATE.KV_${approvals}`,
      ...(options.servers === undefined || options.servers.length === 0
        ? [`$KV.${approvals}.>`]
        : options.servers.map((server) => `$KV.${approvals}.${subjectToken(server)}`)),
    ),
  );
}

/** The schema expander: catalog, describe, expand and groups requests. */
function schemaExpanderPermissions({ s, n, role }: RoleContext): Permissions {
  return merge(
    serviceBase(s, role),
    sub(s.allCatalogRpc, s.allDescribeRpc, s.allExpandRpc, s.allGroupsRpc),
    pub(
      ...n.replies,
      `${n.base}.sessions.*.*.schema.*`,
      ...durable(s.streams.events, s.schemaExpanderConsumer),
      ...bucketRead(s.sessionsBucket),
      `$KV.${s.sessionsBucket}.>`,
      ...bucketRead(s.groupsBucket),
      `$KV.${s.groupsBucket}.>`,
      // Catalogs show what the policy sets permit: watched, never written.
      ...bucketRead(s.policiesBucket),
    ),
  );
}

/** The operator (`toolmesh` commands): reads everything, replays and purges dead letters. */
function operatorPermissions({
  s,
  n,
  role,
  ownerStreams,
  tenantStreams,
  auditStreams,
}: RoleContext): Permissions {
  return merge(
    serviceBase(s, role),
    // `toolmesh watch` follows calls and session events.
    sub(`${n.base}.sessions.>`, `${n.base}.calls.>`, s.allTenantStreamCalls),
    pub(
      s.stats,
      `${n.base}.rpc.*.*`,
      // `toolmesh approvals`: through the resolvers, which keep the waiting calls.
      s.allApprovalsRpc,
      `${n.base}.cancel.*.*`,
      s.allCalls,
      s.allWork,
      // Replaying an owner's dead letter puts it back on its owner's work stream, a tenant's
      // on its tenant's calls stream; `stats` and `call` find those streams by listing them.
      ...(ownerStreams.length === 0 ? [] : [s.allOwnerWork]),
      ...(tenantStreams.length === 0 ? [] : [s.allTenantStreamCalls]),
      ...(ownerStreams.length + tenantStreams.length === 0 ? [] : [`${API}.STREAM.NAMES`]),
      // `stats` shows what each owner's and tenant's stream holds against its bound.
      ...[...tenantStreams, ...ownerStreams].map((st) => `${API}.STREAM.INFO.${st}`),
      ...[...n.streams, ...ownerStreams, ...tenantStreams].flatMap((st) => [
        `${API}.STREAM.MSG.GET.${st}`,
        `${API}.DIRECT.GET.${st}.>`,
        `${API}.CONSUMER.LIST.${st}`,
        `${API}.CONSUMER.INFO.${st}.>`,
      ]),
      // `toolmesh audit`: tenants' trails, read only.
      ...auditStreams.flatMap((st) => [
        `${API}.STREAM.INFO.${st}`,
        `${API}.STREAM.MSG.GET.${st}`,
        ...orderedReader(st),
      ]),
      `${API}.STREAM.MSG.DELETE.${s.streams.dlq}`,
      // `toolmesh dlq purge`.
      `${API}.STREAM.PURGE.${s.streams.dlq}`,
      ...orderedReader(s.streams.dlq),
      ...[...n.buckets, approvalsBucket(s)].flatMap(bucketRead),
      `$KV.${approvalsBucket(s)}.>`,
      `$KV.${s.callsBucket}.>`,
      `$KV.${s.groupsBucket}.>`,
      `$KV.${s.sessionsBucket}.>`,
      `$KV.${s.quotasBucket}.>`,
      `$KV.${s.quotaUsageBucket}.>`,
      `$KV.${s.policiesBucket}.>`,
      // `toolmesh secrets` for the mesh account's executors.
      `$KV.${s.userSecretsBucket}.>`,
    ),
  );
}

/** `toolmesh setup`: creates and updates every stream, bucket and consumer. */
function setupPermissions({
  s,
  n,
  role,
  ownerStreams,
  tenantStreams,
  auditStreams,
}: RoleContext): Permissions {
  return merge(
    serviceBase(s, role),
    pub(
      `${API}.STREAM.NAMES`,
      `${API}.STREAM.LIST`,
      // The account's storage limit and use, which `setup` prints beside the streams' budget.
      `${API}.INFO`,
      ...[
        ...n.streams,
        ...ownerStreams,
        ...tenantStreams,
        ...[...n.buckets, approvalsBucket(s)].map(n.kv),
      ].flatMap((st) => [
        `${API}.STREAM.*.${st}`,
        `${API}.CONSUMER.*.${st}`,
        `${API}.CONSUMER.*.${st}.>`,
        `${API}.CONSUMER.DURABLE.CREATE.${st}.>`,
      ]),
      // Looked up, and deleted with --remove-obsolete.
      // Audit trails are made and brought up to date, never deleted or purged.
      ...auditStreams.flatMap((st) =>
        ["INFO", "CREATE", "UPDATE"].map((op) => `${API}.STREAM.${op}.${st}`),
      ),
      ...obsoleteStreams(s).map((st) => `${API}.STREAM.*.${st}`),
    ),
  );
}

/** Each mesh-account role and how its rights are computed. */
const ROLE_PERMISSIONS: Record<PermissionRole, (context: RoleContext) => Permissions> = {
  frontend: frontendPermissions,
  approver: approverPermissions,
  resolver: resolverPermissions,
  gateway: gatewayPermissions,
  executor: executorPermissions,
  "mcp-bridge": bridgePermissions,
  "schema-expander": schemaExpanderPermissions,
  operator: operatorPermissions,
  setup: setupPermissions,
};

/**
 * The least publish/subscribe rights of one role. Frontends are confined to their tenant (and
 * session, when given): their own call, cancel and RPC subjects, their sessions' events, direct
 * gets of their own results and their own inbox — no bucket, no consumer, no other inbox.
 */
export function rolePermissions(
  role: PermissionRole,
  options: PermissionOptions = {},
): Permissions {
  const s = createSubjects(options.prefix === undefined ? {} : { prefix: options.prefix });
  const n = names(s);
  if (options.tenant !== undefined && options.tenant.trim() === "") {
    bad("--tenant must not be empty: name the tenant whose frontend this is");
  }
  if (options.owner !== undefined) {
    if (role !== "executor" && role !== "mcp-bridge") {
      bad(`--owner is for the executor and mcp-bridge roles, not ${role}`);
    }
    if (options.tools !== undefined || options.servers !== undefined) {
      bad(
        `with --owner the names come from the account's imports: grant them with \`toolmesh auth config --owner ${options.owner}=NAME,…\`, not --tools or --servers`,
      );
    }
    const owner = checkAccountId("owner", options.owner);
    return ownerPermissions(s, role, owner);
  }
  const ownerStreams = (options.owners ?? []).map((o) => s.workStream(checkAccountId("owner", o)));
  const tenantStreams = (options.tenants ?? []).map((t) =>
    s.callsStream(checkAccountId("tenant", t)),
  );
  // Each tenant's audit trail (ADR 0060): written by the resolvers (ADR 0064), made by setup,
  // read by operators; never deleted or purged (the stream denies it too).
  const auditStreams = (options.tenants ?? []).map((t) => s.auditStream(subjectToken(t)));
  const auditWrites = [
    `${n0(s)}.audit.*`,
    ...auditStreams.flatMap((st) => [`${API}.STREAM.INFO.${st}`, `${API}.STREAM.MSG.GET.${st}`]),
  ];
  if (role === "approver" && options.session !== undefined) {
    bad("--session is for the frontend role: an approver decides every call of its tenant");
  }
  if (
    role !== "frontend" &&
    role !== "approver" &&
    (options.tenant !== undefined || options.session !== undefined)
  ) {
    bad(`--tenant and --session are for the frontend and approver roles, not ${role}`);
  }
  if (options.tools !== undefined && role !== "executor") bad("--tools is for the executor role");
  if (options.owners !== undefined && !["resolver", "operator", "setup"].includes(role)) {
    bad("--owners is for the resolver, operator and setup roles");
  }
  if (options.tenants !== undefined && !["resolver", "operator", "setup"].includes(role)) {
    bad("--tenants is for the resolver, operator and setup roles");
  }
  if (options.servers !== undefined && role !== "mcp-bridge") {
    bad("--servers is for the mcp-bridge role");
  }
  return ROLE_PERMISSIONS[role]({
    s,
    n,
    role,
    options,
    ownerStreams,
    tenantStreams,
    auditStreams,
    auditWrites,
  });
}

/** Tenant and owner ids name accounts, streams and subject tokens alike. */
const ACCOUNT_ID = /^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$/;

/** Checks that a tenant or owner id can name an account, a stream and a subject token; throws `invalid_request` saying why. */
export function checkAccountId(kind: "tenant" | "owner", id: string): string {
  if (!ACCOUNT_ID.test(id)) {
    bad(
      `${kind} id "${id}" must be 1 to 64 letters, digits, "-" or "_", starting with a letter or digit`,
    );
  }
  return id;
}

/**
 * The registry keys an owner may register tools under (ADR 0041), as patterns of
 * `{p}.v1.owner.{o}.register.{key}`: its own namespace `{owner}.*`, and each name the operator
 * granted it, `ns.*` granting a namespace (an MCP server's tools).
 */
function ownerGrants(s: Subjects, owner: string, grants: readonly string[]): string[] {
  const keys = [`${owner}.*`];
  for (const name of grants) {
    if (name.endsWith(".*") && name.length > 2 && !/[*>\s]/.test(name.slice(0, -2))) {
      const namespace = name.slice(0, -2);
      if (namespace.includes(".")) bad(`tool namespace "${namespace}" must not contain a dot`);
      keys.push(`${subjectToken(namespace)}.*`);
    } else if (name === "" || /[*>]/.test(name)) {
      bad(
        `owner "${owner}" is granted "${name}": grant a tool name, or a namespace as ns.* (an MCP server's tools)`,
      );
    } else {
      keys.push(s.registryKey(name));
    }
  }
  return [...new Set(keys)];
}

/** Whether two registry-key patterns (a key, or `ns.*`) can name the same tool. */
function grantsOverlap(a: string, b: string): boolean {
  if (a === b) return true;
  const within = (key: string, pattern: string) =>
    pattern.endsWith(".*") && key.startsWith(pattern.slice(0, -1));
  return within(a, b) || within(b, a);
}

/**
 * The subjects of a tenant's crossings into the mesh account (ADR 0031): its calls reach the
 * mesh renamed to its own calls stream's subjects (ADR 0048), what it publishes on
 * `{p}.v1.calls.{t}.{s}` being stored as `{p}.v1.tenant-calls.{t}.{s}`.
 */
function tenantCrossings(s: Subjects, tenant: string) {
  const base = `${s.prefix}.v1`;
  const services: Crossing[] = [
    { subject: s.tenantStreamCalls(tenant), as: `${base}.calls.${tenant}.*` },
    { subject: `${base}.cancel.${tenant}.*` },
    { subject: `${base}.confirm.${tenant}.*` },
    { subject: s.approvalsRpc(tenant) },
    { subject: `${base}.rpc.${tenant}.*` },
    { subject: `${API}.DIRECT.GET.${s.streams.sessions}.${base}.sessions.${tenant}.>` },
    ...auditReads(s, tenant).map((subject) => ({ subject })),
  ];
  return { services, streams: [`${base}.sessions.${tenant}.>`] };
}

/**
 * How a tenant's approver reads its tenant's audit trail from the tenant's account (docs/audit.md):
 * direct gets, served by the stream itself, so they cross into an account without JetStream
 * (whose own JetStream API would answer any other request).
 */
function auditReads(s: Subjects, tenant: string): string[] {
  const token = subjectToken(tenant);
  const get = `${API}.DIRECT.GET.${s.auditStream(token)}`;
  // By sequence, and the last event (its subject in the API subject).
  return [get, `${get}.${s.audit(token)}`];
}

/** One service crossing: the mesh's subject, imported `as` another when given. */
interface Crossing {
  subject: string;
  as?: string;
  responseType?: "stream";
}

/**
 * The subjects of a tool owner's crossings into the mesh account (ADR 0031, ADR 0041): consumer
 * info, pulls and acks of every work consumer of the owner's own work stream `{P}_WORK_{o}`, its
 * owner services, registration under the keys `grants` (from {@link ownerGrants}) only, and the
 * abort broadcast of its own calls (`{p}.v1.control.abort.{o}`). The JetStream API ones are imported under `{p}.js.API` (`as`): an account
 * without JetStream answers every `$JS.API.>` request itself, ahead of an import of the same
 * subject. No consumer or stream management crosses: the mesh creates the stream and each
 * tool's consumer when the owner registers the tool.
 */
function ownerCrossings(s: Subjects, owner: string, grants: readonly string[]) {
  const work = s.workStream(owner);
  const local = (subject: string) => subject.replace(/^\$JS\.API\./, `${s.ownerJsApiPrefix}.`);
  const next = `${API}.CONSUMER.MSG.NEXT.${work}.*`;
  const info = `${API}.CONSUMER.INFO.${work}.*`;
  const services: Crossing[] = [
    { subject: next, as: local(next), responseType: "stream" },
    { subject: info, as: local(info) },
    { subject: `$JS.ACK.${work}.>` },
    { subject: `${s.prefix}.v1.owner.${owner}.*` },
    ...grants.map((key) => ({ subject: `${s.prefix}.v1.owner.${owner}.register.${key}` })),
  ];
  return { services, streams: [s.ownerAbort(owner)] };
}

/**
 * An executor or MCP bridge in the account of tool owner `owner`: it pulls and acks its owner's
 * work through the imports, talks to the mesh's owner services, and hears cancellations. Which
 * names it may register is its account's imports' business (a name not granted finds no
 * responder).
 */
function ownerPermissions(s: Subjects, role: string, owner: string): Permissions {
  const local = (subject: string) => subject.replace(/^\$JS\.API\./, `${s.ownerJsApiPrefix}.`);
  const work = s.workStream(owner);
  const base: Permissions = {
    publish: {
      allow: [
        local(`${API}.CONSUMER.MSG.NEXT.${work}.*`),
        local(`${API}.CONSUMER.INFO.${work}.*`),
        `$JS.ACK.${work}.>`,
        `${s.prefix}.v1.owner.${owner}.>`,
        // Its users' secrets, in its own account's JetStream (ADR 0061): `$JS.API` unprefixed.
        // A bridge's MCP servers may act as their callers too. The first of the owner's to need
        // the bucket makes it.
        ...bucketRead(s.userSecretsBucket),
        `${API}.INFO`,
        `${API}.STREAM.CREATE.KV_${s.userSecretsBucket}`,
      ],
    },
    subscribe: { allow: [s.ownerAbort(owner), `${s.inboxPrefix(role)}.${owner}.>`] },
  };
  // The gateway's deposits cross from the mesh through the account's export; replies go back
  // through the `_R_` subjects the server maps (ADR 0063).
  return merge(base, delegationHolder(s, s.delegationDeposit(owner), "_R_.>"));
}

/**
 * The operator of tool owner `owner`'s users' secrets (`toolmesh secrets` connected as
 * `operator-{o}`): the bucket `{p}_user_secrets` in the owner's account, nothing of the mesh.
 */
function ownerSecretsOperator(s: Subjects): Permissions {
  return {
    publish: { allow: userSecretsWriter(s) },
    subscribe: { allow: [`${s.inboxPrefix("operator")}.>`] },
  };
}

/** The `permissions { … }` block of nats-server configuration, indented by `indent` spaces. */
export function renderPermissions(p: Permissions, indent = 0): string {
  const pad = " ".repeat(indent);
  const list = (subjects: string[]) =>
    subjects.length === 0
      ? "[]"
      : `[\n${subjects.map((x) => `${pad}      ${JSON.stringify(x)}`).join("\n")}\n${pad}    ]`;
  return [
    `${pad}permissions: {`,
    `${pad}  publish: {`,
    `${pad}    allow: ${list(p.publish.allow)}`,
    `${pad}  }`,
    `${pad}  subscribe: {`,
    `${pad}    allow: ${list(p.subscribe.allow)}`,
    `${pad}  }`,
    `${pad}}`,
  ].join("\n");
}

/** Name of the environment variable holding a user's password in the shipped configuration. */
export function passwordVariable(user: string): string {
  return `TOOLMESH_${user.replace(/[^A-Za-z0-9]/g, "_").toUpperCase()}_PASSWORD`;
}

/** The mesh's account, where every stream and bucket lives. */
export const MESH_ACCOUNT = "TOOLMESH";

/** The account of tenant `tenant`'s frontends. */
export function tenantAccount(tenant: string): string {
  return `TENANT_${tenant}`;
}

/** The account of tool owner `owner`'s executors and MCP bridges. */
export function ownerAccount(owner: string): string {
  return `OWNER_${owner}`;
}

/** Limits of each tenant and owner account (nats-server `limits`); a reload applies changes. */
export interface AccountLimits {
  /** Connections at once. Default 1000. */
  maxConnections?: number;
  /** Subscriptions at once, over all connections. Default 100000. */
  maxSubscriptions?: number;
  /** Largest message in bytes. Default 1048576 (the server's own default). */
  maxPayload?: number;
}

/** A user added to one account of the generated configuration. */
export interface ExtraUser {
  /** The account: {@link MESH_ACCOUNT}, `TENANT_{t}` or `OWNER_{o}` of a listed tenant/owner. */
  account: string;
  user: string;
  permissions: Permissions;
}

/** Options of {@link renderAccountConfig}. */
export interface AccountConfigOptions {
  prefix?: string;
  /** One account `TENANT_{t}` with a frontend user `frontend-{t}` each. Default `["default"]`. */
  tenants?: readonly string[];
  /**
   * Tool owners, each with the names granted to it beyond its own namespace `{o}.*` (a tool
   * name, or `ns.*` for a namespace such as an MCP server's tools; often none): one account
   * `OWNER_{o}` with users `executor-{o}`, `mcp-bridge-{o}` (ADR 0041) and `operator-{o}` (its
   * users' secrets, ADR 0061) each. Default none:
   * executors and bridges then run in the mesh account as its users `executor`, `mcp-bridge`.
   */
  owners?: Readonly<Record<string, readonly string[]>>;
  /** Limits of every tenant and owner account. */
  limits?: AccountLimits;
  /** More users, e.g. a frontend confined to one session. */
  extraUsers?: readonly ExtraUser[];
}

/**
 * The users of the mesh account, one per trusted role: the services, and an executor and MCP
 * bridge trusted like them (the builtin tools, a deployment's own servers).
 */
const MESH_ROLES = [
  "resolver",
  "schema-expander",
  "gateway",
  "operator",
  "setup",
  "executor",
  "mcp-bridge",
] as const;

interface Account {
  name: string;
  jetstream: boolean;
  limits?: Required<AccountLimits>;
  users: { user: string; permissions: Permissions }[];
  exports: string[];
  imports: string[];
}

function uniqueIds(kind: "tenant" | "owner", ids: readonly string[]): string[] {
  const seen = new Map<string, string>();
  for (const id of ids) {
    checkAccountId(kind, id);
    // Owner ids are upper-cased in their work stream's name: `a` and `A` would share one.
    const key = id.toLowerCase();
    const other = seen.get(key);
    if (other !== undefined) bad(`${kind} ids "${other}" and "${id}" differ only in case`);
    seen.set(key, id);
  }
  return [...seen.values()];
}

/** An owner with an account: the names granted to it and their registry keys. */
interface OwnerGrant {
  owner: string;
  tools: readonly string[];
  grants: string[];
}

/** The owners of `--owner`, checked; a name is granted to one owner only. */
function ownerGrantList(
  s: Subjects,
  owners: Readonly<Record<string, readonly string[]>>,
): OwnerGrant[] {
  const list = uniqueIds("owner", Object.keys(owners)).map((owner) => ({
    owner,
    tools: owners[owner] ?? [],
    grants: ownerGrants(s, owner, owners[owner] ?? []),
  }));
  // A name is granted to one owner only: no owner may register what another was given.
  const granted: { key: string; owner: string }[] = [];
  for (const { owner, grants } of list) {
    for (const key of grants) {
      const other = granted.find((g) => g.owner !== owner && grantsOverlap(g.key, key));
      if (other !== undefined) {
        bad(
          `owners "${other.owner}" and "${owner}" are both granted names of registry key ${key}: a tool name has one owner`,
        );
      }
      granted.push({ key, owner });
    }
  }
  return list;
}

/**
 * An account whose users reach the mesh through `crossings` only, each exported to it alone:
 * the exports are added to `mesh`, the account with its imports returned.
 */
function crossInto(
  mesh: Account,
  name: string,
  users: Account["users"],
  crossings: { services: Crossing[]; streams: string[] },
  limits: Required<AccountLimits>,
  jetstream = false,
): Account {
  const q = JSON.stringify;
  mesh.exports.push(
    ...crossings.services.map(
      ({ subject, responseType }) =>
        `{ service: ${q(subject)}, accounts: [${name}]${responseType === undefined ? "" : `, response_type: ${responseType}`} }`,
    ),
    ...crossings.streams.map((subject) => `{ stream: ${q(subject)}, accounts: [${name}] }`),
  );
  return {
    name,
    jetstream,
    limits,
    users,
    exports: [],
    imports: [
      ...crossings.services.map(
        ({ subject, as }) =>
          `{ service: { account: ${MESH_ACCOUNT}, subject: ${q(subject)} }${as === undefined ? "" : `, to: ${q(as)}`} }`,
      ),
      ...crossings.streams.map(
        (subject) => `{ stream: { account: ${MESH_ACCOUNT}, subject: ${q(subject)} } }`,
      ),
    ],
  };
}

/**
 * A service of `from` the mesh reaches, exported to the mesh alone: the gateway's deposits of
 * delegation grants into a tool owner's account (ADR 0063).
 */
function exportToMesh(mesh: Account, from: Account, subject: string): void {
  const q = JSON.stringify;
  from.exports.push(`{ service: ${q(subject)}, accounts: [${MESH_ACCOUNT}] }`);
  mesh.imports.push(`{ service: { account: ${from.name}, subject: ${q(subject)} } }`);
}

/** The mesh account, then one account per tenant and per owner, then the extra users added. */
function meshAccounts(
  s: Subjects,
  options: AccountConfigOptions,
  tenants: string[],
  owners: OwnerGrant[],
): Account[] {
  const prefix = options.prefix === undefined ? {} : { prefix: options.prefix };
  const limits: Required<AccountLimits> = {
    maxConnections: options.limits?.maxConnections ?? 1000,
    maxSubscriptions: options.limits?.maxSubscriptions ?? 100_000,
    maxPayload: options.limits?.maxPayload ?? 1_048_576,
  };
  const ownerIds = owners.map(({ owner }) => owner);
  const mesh: Account = {
    name: MESH_ACCOUNT,
    jetstream: true,
    users: MESH_ROLES.map((role) => ({
      user: role,
      permissions: rolePermissions(role, {
        ...prefix,
        ...(["resolver", "operator", "setup"].includes(role) ? { owners: ownerIds, tenants } : {}),
      }),
    })),
    exports: [],
    imports: [],
  };
  const accounts: Account[] = [mesh];
  for (const tenant of tenants) {
    accounts.push(
      crossInto(
        mesh,
        tenantAccount(tenant),
        [
          {
            user: `frontend-${tenant}`,
            permissions: rolePermissions("frontend", { ...prefix, tenant }),
          },
          {
            user: `approver-${tenant}`,
            permissions: rolePermissions("approver", { ...prefix, tenant }),
          },
        ],
        tenantCrossings(s, tenant),
        limits,
      ),
    );
  }
  for (const { owner, grants } of owners) {
    // JetStream in an owner's account holds its users' secrets alone (ADR 0061).
    accounts.push(
      crossInto(
        mesh,
        ownerAccount(owner),
        [
          ...(["executor", "mcp-bridge"] as const).map((role) => ({
            user: `${role}-${owner}`,
            permissions: rolePermissions(role, { ...prefix, owner }),
          })),
          { user: `operator-${owner}`, permissions: ownerSecretsOperator(s) },
        ],
        ownerCrossings(s, owner, grants),
        limits,
        true,
      ),
    );
    exportToMesh(mesh, accounts.at(-1) as Account, s.delegationDeposit(owner));
  }
  for (const extra of options.extraUsers ?? []) {
    const account = accounts.find((a) => a.name === extra.account);
    if (account === undefined) bad(`no account ${extra.account} for user ${extra.user}`);
    account.users.push({ user: extra.user, permissions: extra.permissions });
  }
  return accounts;
}

/** One account's block inside `accounts { … }`. */
function renderAccount(a: Account): string {
  const q = JSON.stringify;
  const list = (items: string[]) =>
    items.length === 0 ? "[]" : `[\n${items.map((x) => `      ${x}`).join("\n")}\n    ]`;
  return [
    `  ${a.name}: {`,
    `    jetstream: ${a.jetstream ? "enabled" : "disabled"}`,
    ...(a.limits === undefined
      ? []
      : [
          `    limits: { max_connections: ${a.limits.maxConnections}, max_subscriptions: ${a.limits.maxSubscriptions}, max_payload: ${a.limits.maxPayload} }`,
        ]),
    "    users: [",
    a.users
      .map(({ user, permissions }) =>
        [
          "      {",
          `        user: ${q(user)}`,
          `        password: $${passwordVariable(user)}`,
          renderPermissions(permissions, 8),
          "      }",
        ].join("\n"),
      )
      .join("\n"),
    "    ]",
    ...(a.exports.length === 0 ? [] : [`    exports: ${list(a.exports)}`]),
    ...(a.imports.length === 0 ? [] : [`    imports: ${list(a.imports)}`]),
    "  }",
  ].join("\n");
}

/** The comment heading the accounts: what they are, the command that made them, how to change them. */
function accountConfigHeader(
  options: AccountConfigOptions,
  tenants: string[],
  owners: OwnerGrant[],
): string[] {
  const flags = [
    ...(options.prefix === undefined ? [] : [`--prefix ${options.prefix}`]),
    ...(options.tenants === undefined ? [] : [`--tenants ${tenants.join(",")}`]),
    ...owners.map(({ owner, tools }) =>
      tools.length === 0 ? `--owner ${owner}` : `--owner ${owner}=${tools.join(",")}`,
    ),
  ];
  return [
    "# toolmesh NATS accounts (docs/security.md, ADR 0031): the mesh account TOOLMESH holds every",
    "# stream and the trusted services; each tenant's frontends and each tool owner's executors",
    "# and bridges live in an account of their own and reach the mesh only through the exports",
    "# below, each exported to the one account that imports it.",
    `# Generated by \`toolmesh auth config${flags.length === 0 ? "" : ` ${flags.join(" ")}`}\`. Passwords come from the`,
    "# environment (TOOLMESH_<USER>_PASSWORD); swap them for nkeys or TLS-mapped users as you like.",
    "# Include this file from the server's configuration, which enables JetStream and TLS; add a",
    "# tenant, an owner or an owner's granted name by regenerating it and `nats-server --signal reload`",
    "# (twice: the first reload leaves a new account's imports out). Each tenant's calls are stored",
    "# in its own calls stream {P}_CALLS_{tenant} (ADR 0048): create a new tenant's before its first",
    "# call with `toolmesh setup --tenants TENANT`.",
    ...(owners.length === 0
      ? [
          "# No tool owner accounts: executors and MCP bridges (the builtin tools of `toolmesh dev`,",
          "# compose and the chart) connect as the mesh account's users `executor` and `mcp-bridge`,",
          "# trusted like the services. Give an owner an account with `--owner OWNER[=NAME,…]`.",
        ]
      : [
          "# Each owner's account crosses to every work consumer of its own work stream",
          "# {P}_WORK_{owner}, and registers tools under its namespace OWNER.* and the names",
          "# granted to it (ADR 0041): tools added later in those names need no reload.",
        ]),
  ];
}

/**
 * The nats-server `accounts { … }` block of ADR 0031: the mesh account `TOOLMESH` (JetStream,
 * the trusted services), one account per tenant (its frontends) and per tool owner (its
 * executors and bridges), each crossing exported to the one account that imports it. Passwords
 * come from environment variables (`$TOOLMESH_RESOLVER_PASSWORD`, …). `deploy/nats/toolmesh.conf`
 * is this text for the defaults; a test keeps the two equal.
 */
export function renderAccountConfig(options: AccountConfigOptions = {}): string {
  const s = createSubjects(options.prefix === undefined ? {} : { prefix: options.prefix });
  const tenants = uniqueIds("tenant", options.tenants ?? ["default"]);
  const owners = ownerGrantList(s, options.owners ?? {});
  const accounts = meshAccounts(s, options, tenants, owners);
  return [
    ...accountConfigHeader(options, tenants, owners),
    "accounts {",
    accounts.map(renderAccount).join("\n"),
    "}",
    "",
  ].join("\n");
}
