import type { NatsConnection } from "@nats-io/nats-core";
import { ToolmeshClient } from "@toolmesh/client";
import { ErrorCode, createSubjects } from "@toolmesh/protocol";
import type { Subjects } from "@toolmesh/protocol";
import { connectNats } from "@toolmesh/nats";
import { ToolRegistry } from "@toolmesh/registry";
import type { RuntimeConfig } from "@toolmesh/runtime";
import { createLogger } from "@toolmesh/telemetry";
import { Option } from "commander";
import type { Logger } from "@toolmesh/telemetry";
import { checkReplyInbox } from "./denied.js";
import { say, typedFailure } from "./print.js";

/** The role a command connects as: the tenant's approver is `approver-{tenant}` of auth config. */
export type CliRole = "frontend" | "operator" | "approver";

/**
 * The log of a command's own NATS helpers (a registry read, stats): warnings and errors only,
 * on stderr, so that a command's output stays what it prints.
 */
export function commandLog(): Logger {
  return createLogger({ service: "cli", level: "warn", destination: process.stderr });
}

/**
 * Connects as the CLI. Replies arrive below the inbox prefix of the role the command acts as:
 * the tenant's frontend, or the operator (docs/security.md). A user NATS does not let receive
 * them fails at once with a line saying which credentials the command needs, unless the
 * command asks nothing (`replies: false`: `watch` only subscribes).
 */
export async function connectCli(
  config: RuntimeConfig,
  as: CliRole,
  { replies = true }: { replies?: boolean } = {},
): Promise<NatsConnection> {
  const subjects = createSubjects({ prefix: config.prefix });
  const inboxPrefix =
    as === "frontend"
      ? subjects.frontendInboxPrefix(config.tenant)
      : as === "approver"
        ? subjects.approverInboxPrefix(config.tenant)
        : subjects.inboxPrefix(as);
  const nc = await connectNats({ ...config.nats, name: "toolmesh-cli", inboxPrefix });
  if (!replies) return nc;
  try {
    await checkReplyInbox(nc, { role: as, tenant: config.tenant, inboxPrefix });
  } catch (err) {
    await nc.close();
    throw err;
  }
  return nc;
}

/**
 * Runs `fn` connected as the CLI, then disconnects. Replies arrive below the inbox prefix of
 * the role the command acts as: the tenant's frontend, or the operator (docs/security.md).
 */
export async function withConnection<T>(
  config: RuntimeConfig,
  fn: (nc: NatsConnection) => Promise<T>,
  as: CliRole = "operator",
): Promise<T> {
  const nc = await connectCli(config, as);
  try {
    return await fn(nc);
  } finally {
    await nc.close();
  }
}

/**
 * Runs `fn` connected as the operator, then disconnects. A typed error (an unknown sequence, a
 * quota that cannot be set, a missing stream) is printed and exits 1 (`typedFailure`).
 */
export function asOperator(
  config: RuntimeConfig,
  json: boolean | undefined,
  fn: (nc: NatsConnection, subjects: Subjects) => Promise<number>,
  as: CliRole = "operator",
): Promise<number> {
  return withConnection(
    config,
    async (nc) => {
      try {
        return await fn(nc, createSubjects({ prefix: config.prefix }));
      } catch (err) {
        return typedFailure(err, json);
      }
    },
    as,
  );
}

/** Runs `fn` with a client connected as this configuration's frontend, then disconnects. */
export function withClient<T>(
  config: RuntimeConfig,
  fn: (client: ToolmeshClient) => Promise<T>,
): Promise<T> {
  return withConnection(
    config,
    (nc) =>
      fn(
        new ToolmeshClient(nc, {
          prefix: config.prefix,
          tenant: config.tenant,
          defaultTimeoutMs: config.defaultTimeoutMs,
        }),
      ),
    "frontend",
  );
}

/** `toolmesh tools list`: name and one line per tool. */
export async function toolsListCommand(
  config: RuntimeConfig,
  options: { json?: boolean },
): Promise<number> {
  return withConnection(config, async (nc) => {
    const registry = await openForReading(nc, config);
    const tools = await registry.fetchAll();
    if (options.json === true) {
      say(
        JSON.stringify(
          tools.map((t) => ({ name: t.name, summary: t.summary, groups: t.groups, kind: t.kind })),
        ),
      );
    } else if (tools.length === 0) {
      say("no tools registered");
    } else {
      const width = Math.max(...tools.map((t) => t.name.length));
      for (const t of tools) say(`${t.name.padEnd(width)}  ${t.summary}`);
    }
    return 0;
  });
}

/** `toolmesh tools show`: the full registry entry of one tool. */
export async function toolsShowCommand(
  config: RuntimeConfig,
  name: string,
  options: { json?: boolean },
): Promise<number> {
  return withConnection(config, async (nc) => {
    const registry = await openForReading(nc, config);
    const tool = await registry.fetch(name);
    if (tool === undefined) {
      say(
        options.json === true
          ? JSON.stringify({
              error: { code: ErrorCode.UnknownTool, message: `unknown tool "${name}"` },
            })
          : `unknown tool "${name}"`,
      );
      return 1;
    }
    say(options.json === true ? JSON.stringify(tool) : JSON.stringify(tool, null, 2));
    return 0;
  });
}

/** The registry, read once (no watch), as the CLI's commands read it. */
export async function openForReading(
  nc: NatsConnection,
  config: RuntimeConfig,
): Promise<ToolRegistry> {
  return ToolRegistry.open(nc, {
    subjects: createSubjects({ prefix: config.prefix }),
    log: commandLog(),
    watch: false,
    existing: "keep",
  });
}

/** `--as operator|approver`: a tenant's command run as the operator or as its approver user. */
export function actingAsOption(): Option {
  return new Option(
    "--as <role>",
    "connect as the operator, or as the tenant's approver user (auth config)",
  )
    .choices(["operator", "approver"])
    .default("operator");
}
