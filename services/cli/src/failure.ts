import { ConfigError } from "@toolmesh/runtime";
import { ToolmeshError } from "@toolmesh/protocol";
import { TelemetryConfigError } from "@toolmesh/telemetry";
import { PermissionDeniedError, describeViolation, permissionViolation } from "./denied.js";
import { UsageError } from "./usage-errors.js";

/**
 * What a failed command tells people, on one line: the known errors' own messages, and NATS
 * connection failures as `cannot connect to NATS at <url>: <reason>`. The stack only when
 * `debug` (the `--log-level debug` or `trace` the user asked for).
 */
export function describeFailure(err: unknown, natsUrl: string, debug: boolean): string {
  const error = err instanceof Error ? err : new Error(String(err));
  const line = oneLine(error, natsUrl);
  return debug && error.stack !== undefined ? `${line}\n${error.stack}` : line;
}

function oneLine(error: Error, natsUrl: string): string {
  // Libraries wrap NATS's refusal of a right (a request's error, an `unavailable`): name it.
  const violation = permissionViolation(error);
  if (violation !== undefined && !(error instanceof PermissionDeniedError))
    return describeViolation(violation);
  if (
    error instanceof ConfigError ||
    error instanceof ToolmeshError ||
    error instanceof TelemetryConfigError ||
    error instanceof UsageError ||
    error instanceof PermissionDeniedError
  )
    return error.message;
  const code = (error as { code?: unknown }).code;
  if (error.name === "ConnectionError" || code === "ENOTFOUND" || code === "ECONNREFUSED") {
    const reason =
      code === "ENOTFOUND"
        ? "host not found"
        : error.message.replace(/^getaddrinfo \w+ /, "").toLowerCase();
    return `cannot connect to NATS at ${natsUrl}: ${reason}`;
  }
  if (error.name === "AuthorizationError" || /authorization/i.test(error.message))
    return `NATS refused the credentials at ${natsUrl}: ${error.message}`;
  return error.message === "" ? error.name : error.message;
}

/**
 * Lets output into a closed pipe (`toolmesh tools list | head -1`) end the process quietly with
 * the status it would have had, instead of an EPIPE stack.
 */
export function exitQuietlyOnClosedPipe(): void {
  for (const stream of [process.stdout, process.stderr]) {
    stream.on("error", (err: NodeJS.ErrnoException) => {
      if (err.code === "EPIPE") process.exit(process.exitCode ?? 0);
      throw err;
    });
  }
}
