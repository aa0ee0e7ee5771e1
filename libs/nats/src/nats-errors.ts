import {
  AuthorizationError,
  ClosedConnectionError,
  ConnectionError,
  DrainingConnectionError,
  NoRespondersError,
  PermissionViolationError,
  ProtocolError,
  RequestError,
  TimeoutError,
  UserAuthenticationExpiredError,
} from "@nats-io/nats-core";
import { JetStreamApiError, JetStreamError } from "@nats-io/jetstream";

const NATS_ERRORS = [
  AuthorizationError,
  ClosedConnectionError,
  ConnectionError,
  DrainingConnectionError,
  JetStreamApiError,
  JetStreamError,
  NoRespondersError,
  PermissionViolationError,
  ProtocolError,
  RequestError,
  TimeoutError,
  UserAuthenticationExpiredError,
];

/**
 * Whether `err` is the NATS client's report of trouble with the server, the connection or
 * JetStream (worth trying again: `unavailable`), rather than a failure of ours (`internal`).
 */
export function isNatsError(err: unknown): boolean {
  return NATS_ERRORS.some((type) => err instanceof type);
}
