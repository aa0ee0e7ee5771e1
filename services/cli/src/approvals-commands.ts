import type { Command } from "commander";
import type { NatsConnection } from "@nats-io/nats-core";
import type { ApprovalEntry, ApprovalReply, ApprovalRequest } from "@toolmesh/protocol";
import { ApprovalReplySchema, createSubjects } from "@toolmesh/protocol";
import { requestOk } from "@toolmesh/nats";
import type { RuntimeConfig } from "@toolmesh/runtime";
import { actingAsOption, connectCli } from "./commands.js";
import { say, typedFailure } from "./print.js";

// `toolmesh approvals`: the calls of a tenant that wait for a person (ADR 0059), listed and
// decided through the resolvers, as the operator or as the tenant's approver.

/** Whom the command acts as: the operator (mesh account) or the tenant's approver user. */
type Acting = "operator" | "approver";

interface ApprovalsOptions {
  json?: boolean;
  as?: Acting;
}

interface DecideOptions extends ApprovalsOptions {
  reason?: string;
  session?: string;
  by?: string;
}

/** How long a decision may take the resolvers (it routes or ends the call), in ms. */
const DECIDE_TIMEOUT_MS = 10_000;

function connect(config: RuntimeConfig, as: Acting | undefined): Promise<NatsConnection> {
  return connectCli(config, as === "approver" ? "approver" : "operator");
}

async function ask(
  config: RuntimeConfig,
  options: ApprovalsOptions,
  request: ApprovalRequest,
): Promise<ApprovalReply> {
  const nc = await connect(config, options.as);
  try {
    return await requestOk(
      nc,
      createSubjects({ prefix: config.prefix }).approvalsRpc(config.tenant),
      request,
      ApprovalReplySchema,
      { timeoutMs: DECIDE_TIMEOUT_MS, service: "resolver" },
    );
  } finally {
    await nc.close();
  }
}

/** `toolmesh approvals list`: the tenant's calls waiting for approval. */
export async function listApprovals(
  config: RuntimeConfig,
  options: ApprovalsOptions,
): Promise<number> {
  try {
    const reply = await ask(config, options, { op: "list" });
    const entries = reply.approvals ?? [];
    if (options.json === true) {
      say(JSON.stringify(entries));
      return 0;
    }
    if (entries.length === 0) {
      say(`no call of tenant ${config.tenant} waits for approval`);
      return 0;
    }
    for (const e of entries) say(describeEntry(e));
    return 0;
  } catch (err) {
    return typedFailure(err, options.json);
  }
}

function describeEntry(e: ApprovalEntry): string {
  return [
    `${e.call_id}  ${e.tool}  session ${e.session}${e.agent === undefined ? "" : `  agent ${e.agent}`}`,
    `  args ${JSON.stringify(e.args)}`,
    `  requested ${new Date(e.requested_at).toISOString()}, expires ${new Date(e.expires_at).toISOString()}; policies ${e.policies.join(", ")} (${e.policy_version})`,
  ].join("\n");
}

/** `toolmesh approvals approve|deny CALL_ID`: decides one waiting call, once. */
export async function decideApproval(
  config: RuntimeConfig,
  op: "approve" | "deny",
  callId: string,
  options: DecideOptions,
): Promise<number> {
  try {
    const reply = await ask(config, options, {
      op,
      call_id: callId,
      ...(options.session === undefined ? {} : { session_id: options.session }),
      ...(options.reason === undefined ? {} : { reason: options.reason }),
      ...(options.by === undefined ? {} : { by: options.by }),
    });
    if (options.json === true) say(JSON.stringify(reply.decided ?? {}));
    else
      say(
        op === "approve"
          ? `call ${callId} approved: it runs now`
          : `call ${callId} denied: its caller gets approval_denied`,
      );
    return 0;
  } catch (err) {
    return typedFailure(err, options.json);
  }
}

/** Adds `approvals list|approve|deny`. `--tenant` is the program's own option: whose calls. */
export function addApprovalCommands(
  program: Command,
  config: () => RuntimeConfig,
  run: (command: () => Promise<number>) => void,
): void {
  const approvals = program
    .command("approvals")
    .description("list, approve and deny calls that wait for a person (docs/policy.md)");

  approvals
    .command("list")
    .description("the tenant's calls waiting for approval (--tenant, default TOOLMESH_TENANT)")
    .option("--json", "print a JSON array")
    .addOption(actingAsOption())
    .action((o: ApprovalsOptions) => run(() => listApprovals(config(), o)));

  for (const op of ["approve", "deny"] as const) {
    approvals
      .command(op)
      .description(
        op === "approve"
          ? "approve a waiting call: it runs once, its deadline counting from now"
          : "deny a waiting call: it ends with approval_denied and never runs",
      )
      .argument("<call-id>", "the call's id (tool_call_id)")
      .option("--reason <text>", "why, recorded with the call")
      .option("--session <id>", "the call's session, when its id is used in two sessions")
      .option("--by <name>", "a name recorded with the decision")
      .option("--json", "print JSON")
      .addOption(actingAsOption())
      .action((callId: string, o: DecideOptions) =>
        run(() => decideApproval(config(), op, callId, o)),
      );
  }
}
