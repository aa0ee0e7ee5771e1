import { PermissionViolationError } from "@nats-io/nats-core";
import { ErrorCode, ToolmeshError } from "@toolmesh/protocol";

/**
 * The error of the calls of a session whose events NATS will not let this connection receive
 * (`err`, from the subscription to `subject`): its user belongs to another tenant, or is
 * confined to other sessions. Nothing would ever answer them, so they settle with it at once
 * instead of at their deadline. Undefined for any other error of a subscription.
 */
export function eventsDenied(
  err: Error,
  subject: string,
  tenant: string,
): ToolmeshError | undefined {
  if (!(err instanceof PermissionViolationError)) return undefined;
  return new ToolmeshError(
    ErrorCode.PermissionDenied,
    `NATS denied this connection the events on ${subject}: its user may not act for tenant ${tenant} or this session (check the client's tenant and the user's credentials)`,
    { retryable: false, details: { subject, tenant } },
  );
}
