import type { NatsConnection, PermissionViolationError } from "@nats-io/nats-core";
import { createInbox } from "@nats-io/nats-core";

/** NATS refused this user something a command needs; the message says what to do about it. */
export class PermissionDeniedError extends Error {
  override readonly name = "PermissionDeniedError";
}

/** Whom a CLI connection acts as, and so which credentials its reply inbox asks for. */
export interface InboxOwner {
  role: "frontend" | "operator" | "approver";
  tenant: string;
  inboxPrefix: string;
}

/**
 * Fails at once, with a {@link PermissionDeniedError} saying what to do, when NATS does not let
 * this user subscribe below the inbox prefix of the role the command acts as — else every reply
 * would be lost and a call would wait out its whole budget. A refused subscription is answered
 * with `-ERR` before the `PONG` of the flush that follows it.
 */
export async function checkReplyInbox(nc: NatsConnection, owner: InboxOwner): Promise<void> {
  const sub = nc.subscribe(createInbox(owner.inboxPrefix));
  await nc.flush();
  if (!sub.isClosed()) {
    sub.unsubscribe();
    return;
  }
  const refused = await sub.closed;
  const violation = permissionViolation(refused);
  if (violation === undefined) return;
  throw new PermissionDeniedError(deniedInboxMessage(violation, owner), { cause: refused });
}

function deniedInboxMessage(violation: PermissionViolationError, owner: InboxOwner): string {
  const what = `${violation.operation} to "${violation.subject}"`;
  switch (owner.role) {
    case "frontend":
      return (
        `NATS denied this user the subjects of tenant ${owner.tenant} (${what}): set --tenant ` +
        `(TOOLMESH_TENANT) to the tenant of these credentials, or use tenant ${owner.tenant}'s ` +
        `frontend credentials`
      );
    case "approver":
      return `NATS denied this user (${what}): --as approver needs the credentials of tenant ${owner.tenant}'s approver user`;
    case "operator":
      return `NATS denied this user (${what}): this command needs the operator's credentials`;
  }
}

/** The permission violation behind `err`, following its causes; undefined when there is none. */
export function permissionViolation(err: unknown): PermissionViolationError | undefined {
  // nats.js wraps it (a RequestError), and so do toolmesh's libraries (`unavailable`).
  for (let e = err, depth = 0; e instanceof Error && depth < 8; e = e.cause, depth++)
    if (e.name === "PermissionViolationError") return e as PermissionViolationError;
  return undefined;
}

/** One line for a permission violation no inbox check foresaw: what was denied, what to do. */
export function describeViolation(violation: PermissionViolationError): string {
  return (
    `NATS denied this user (${violation.operation} to "${violation.subject}"): these ` +
    `credentials lack a right this command needs (toolmesh auth permissions --role <role> ` +
    `prints each role's)`
  );
}
