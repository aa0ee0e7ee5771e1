import type { NatsConnection } from "@nats-io/nats-core";
import { RequestError, TimeoutError } from "@nats-io/nats-core";
import type { z } from "zod";
import { ErrorCode, ToolmeshError, decodeJson, encodeJson, ensureError } from "@toolmesh/protocol";

/** Options of {@link requestReply}. */
export interface RequestReplyOptions {
  /** How long to wait for the reply, in ms. */
  timeoutMs: number;
  /** Who answers, as errors name it (`"resolver"`, `"schema expander"`). */
  service: string;
}

/**
 * Sends `body` as JSON on `subject` and returns the reply parsed with `replySchema`. Failures
 * are typed: nobody listening → `unavailable` ("no resolver is running"), no reply within
 * `timeoutMs` → `unavailable`, a reply that is not JSON or of another shape → `internal`.
 */
export async function requestReply<T>(
  nc: NatsConnection,
  subject: string,
  body: unknown,
  replySchema: z.ZodType<T>,
  options: RequestReplyOptions,
): Promise<T> {
  const { service, timeoutMs } = options;
  let data: Uint8Array;
  try {
    data = (await nc.request(subject, encodeJson(body), { timeout: timeoutMs })).data;
  } catch (err) {
    if (err instanceof RequestError && err.isNoResponders()) {
      throw new ToolmeshError(ErrorCode.Unavailable, `no ${service} is running`, { cause: err });
    }
    if (err instanceof TimeoutError) {
      throw new ToolmeshError(
        ErrorCode.Unavailable,
        `the ${service} did not answer within ${timeoutMs} ms`,
        { cause: err },
      );
    }
    throw ensureError(err, ErrorCode.Unavailable);
  }
  let reply: unknown;
  try {
    reply = decodeJson(data);
  } catch (err) {
    throw new ToolmeshError(ErrorCode.Internal, `the ${service} sent a reply that is not JSON`, {
      cause: err,
    });
  }
  const parsed = replySchema.safeParse(reply);
  if (!parsed.success) {
    throw new ToolmeshError(ErrorCode.Internal, `the ${service} sent a reply of another shape`, {
      cause: parsed.error,
    });
  }
  return parsed.data;
}
