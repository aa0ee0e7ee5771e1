import type { Subjects } from "@toolmesh/protocol";
import { ErrorCode, ToolmeshError, createSubjects, subjectToken } from "@toolmesh/protocol";
import { obsoleteStreams } from "@toolmesh/nats";

/** The NATS users of a mesh, one per role (docs/security.md). */
export const PERMISSION_ROLES = [
  "frontend",
  "resolver",
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
  /** `frontend`: the tenant id it is confined to (required). */
  tenant?: string;
  /** `frontend`: confine it further to this one session. */
  session?: string;
  /**
   * `executor`: the tool names it may register (its registry keys); `ns.*` stands for every
   * tool of namespace `ns`. Default any tool name (ownership then rests on first-wins alone).
   */
  tools?: readonly string[];
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
    ],
    kv,
    /** Replies to requests of frontends and operators. */
    replies: [`_INBOX.${s.prefix}.frontend.>`, `_INBOX.${s.prefix}.operator.>`],
  };
}

const API = "$JS.API";

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
    subscribe: { allow: [`${s.inboxPrefix(role)}.>`, s.stats] },
  };
}

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
      ...workConsumers(s, tools),
      `${API}.STREAM.MSG.GET.${s.streams.sessions}`,
      ...bucketRead(s.callsBucket),
      `$KV.${s.callsBucket}.>`,
      ...registryWrites(s, tools),
    ),
  );
}

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
  if (role !== "frontend" && (options.tenant !== undefined || options.session !== undefined)) {
    bad(`--tenant and --session are for the frontend role, not ${role}`);
  }
  if (options.tools !== undefined && role !== "executor") bad("--tools is for the executor role");
  if (options.servers !== undefined && role !== "mcp-bridge") {
    bad("--servers is for the mcp-bridge role");
  }
  switch (role) {
    case "frontend": {
      if (options.tenant === undefined) bad("the frontend role needs --tenant <id>");
      const t = subjectToken(options.tenant);
      const session = options.session === undefined ? "*" : subjectToken(options.session);
      return {
        publish: {
          allow: [
            `${n.base}.calls.${t}.${session}`,
            `${n.base}.cancel.${t}.${session}`,
            `${n.base}.rpc.${t}.*`,
            `${API}.DIRECT.GET.${s.streams.sessions}.${n.base}.sessions.${t}.${session}.>`,
          ],
        },
        subscribe: {
          allow: [
            `${n.base}.sessions.${t}.${session}.>`,
            `${s.frontendInboxPrefix(options.tenant, options.session)}.>`,
          ],
        },
      };
    }
    case "resolver":
      return merge(
        serviceBase(s, role),
        // The deadline keeper follows work and results as they are published (core NATS).
        sub(s.allCancel, s.allResolveRpc, s.allWork, s.allResults),
        pub(
          ...n.replies,
          s.allWork,
          `${n.base}.sessions.*.*.result.*`,
          `${n.base}.sessions.*.*.rejected.*`,
          s.allMissingArguments.replace(/>$/, "*.*"),
          s.abort,
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
        ),
      );
    case "executor":
      return toolHost(s, role, options.tools);
    case "mcp-bridge": {
      // Approved (pinned) tool definitions, one key per server; `toolmesh setup` provisions the
      // bucket, and a bridge allowed to creates it when it first pins.
      const approvals = approvalsBucket(s);
      return merge(
        toolHost(
          s,
          role,
          options.servers?.map((server) => `${server}.*`),
        ),
        pub(
          ...bucketRead(approvals),
          `${API}.STREAM.CREATE.KV_${approvals}`,
          ...(options.servers === undefined || options.servers.length === 0
            ? [`$KV.${approvals}.>`]
            : options.servers.map((server) => `$KV.${approvals}.${subjectToken(server)}`)),
        ),
      );
    }
    case "schema-expander":
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
        ),
      );
    case "operator":
      return merge(
        serviceBase(s, role),
        // `toolmesh watch` follows calls and session events.
        sub(`${n.base}.sessions.>`, `${n.base}.calls.>`),
        pub(
          s.stats,
          `${n.base}.rpc.*.*`,
          `${n.base}.cancel.*.*`,
          s.allCalls,
          s.allWork,
          ...n.streams.flatMap((st) => [
            `${API}.STREAM.MSG.GET.${st}`,
            `${API}.DIRECT.GET.${st}.>`,
            `${API}.CONSUMER.LIST.${st}`,
            `${API}.CONSUMER.INFO.${st}.>`,
          ]),
          `${API}.STREAM.MSG.DELETE.${s.streams.dlq}`,
          ...orderedReader(s.streams.dlq),
          ...[...n.buckets, approvalsBucket(s)].flatMap(bucketRead),
          `$KV.${approvalsBucket(s)}.>`,
          `$KV.${s.callsBucket}.>`,
          `$KV.${s.groupsBucket}.>`,
          `$KV.${s.sessionsBucket}.>`,
          `$KV.${s.quotasBucket}.>`,
          `$KV.${s.quotaUsageBucket}.>`,
        ),
      );
    case "setup":
      return merge(
        serviceBase(s, role),
        pub(
          `${API}.STREAM.NAMES`,
          `${API}.STREAM.LIST`,
          ...[...n.streams, ...[...n.buckets, approvalsBucket(s)].map(n.kv)].flatMap((st) => [
            `${API}.STREAM.*.${st}`,
            `${API}.CONSUMER.*.${st}`,
            `${API}.CONSUMER.*.${st}.>`,
            `${API}.CONSUMER.DURABLE.CREATE.${st}.>`,
          ]),
          // Looked up, and deleted with --remove-obsolete.
          ...obsoleteStreams(s).map((st) => `${API}.STREAM.*.${st}`),
        ),
      );
  }
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

/** Options of {@link renderAccountConfig}. */
export interface AccountConfigOptions {
  prefix?: string;
  /** One frontend user `frontend-{tenant}` per tenant. Default `["default"]`. */
  tenants?: readonly string[];
  /** The account's name. Default `TOOLMESH`. */
  account?: string;
  /** More users, e.g. a frontend confined to one session or an executor owning some tools. */
  extraUsers?: readonly { user: string; permissions: Permissions }[];
}

/**
 * The `accounts { … }` block with one user per role and per tenant, passwords taken from
 * environment variables (`$TOOLMESH_RESOLVER_PASSWORD`, …). `deploy/nats/toolmesh.conf` is this
 * text for the defaults; a test keeps the two equal.
 */
export function renderAccountConfig(options: AccountConfigOptions = {}): string {
  const prefix = options.prefix === undefined ? {} : { prefix: options.prefix };
  const users: { user: string; permissions: Permissions }[] = [];
  for (const role of PERMISSION_ROLES) {
    if (role === "frontend") continue;
    users.push({ user: role, permissions: rolePermissions(role, prefix) });
  }
  for (const tenant of options.tenants ?? ["default"]) {
    users.push({
      user: `frontend-${tenant}`,
      permissions: rolePermissions("frontend", { ...prefix, tenant }),
    });
  }
  users.push(...(options.extraUsers ?? []));
  const body = users.map(({ user, permissions }) =>
    [
      "      {",
      `        user: ${JSON.stringify(user)}`,
      `        password: $${passwordVariable(user)}`,
      renderPermissions(permissions, 8),
      "      }",
    ].join("\n"),
  );
  return [
    "# toolmesh NATS users, one per role, each with the least rights it needs (docs/security.md).",
    `# Generated by \`toolmesh auth config${options.prefix === undefined ? "" : ` --prefix ${options.prefix}`}\`; a frontend user for another tenant:`,
    "# `toolmesh auth permissions --role frontend --tenant <id>`. Passwords come from the",
    "# environment (TOOLMESH_<USER>_PASSWORD); swap them for nkeys or TLS-mapped users as you like.",
    "# Include this file from the server's configuration, which enables JetStream and TLS.",
    "accounts {",
    `  ${options.account ?? "TOOLMESH"}: {`,
    "    jetstream: enabled",
    "    users: [",
    body.join("\n"),
    "    ]",
    "  }",
    "}",
    "",
  ].join("\n");
}
