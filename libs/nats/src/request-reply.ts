import type { NatsConnection } from "@nats-io/nats-core";
import { RequestError, TimeoutError } from "@nats-io/nats-core";
import type { z } from "zod";
import type { WireError } from "@toolmesh/protocol";
import {
  ErrorCode,
  ToolmeshError,
  decodeJson,
  encodeJson,
  ensureError,
  payloadTooLarge,
} from "@toolmesh/protocol";

/** Options of {@link requestReply}. */
export interface RequestReplyOptions {
  /** How long to wait for the reply, in ms. */
  timeoutMs: number;
  /** Who answers, as errors name it (`"resolver"`, `"schema expander"`). */
  service: string;
  /**
   * The error of a request nobody answered, when the caller knows better than "no … is
   * running" (a subject outside the caller's grants). Undefined keeps the default.
   */
  noResponders?: (err: RequestError) => Promise<ToolmeshError | undefined>;
}

/**
 * Sends `body` as JSON (or as it is, when it is already JSON's UTF-8 bytes) on `subject` and
 * returns the reply parsed with `replySchema`. Failures
 * are typed: a body larger than the server's `max_payload` → `payload_too_large` (nothing
 * sent), nobody listening → `unavailable` ("no resolver is running"), no reply within
 * `timeoutMs` → `unavailable`, a reply that is not JSON or of another shape → `internal`. A
 * refusal in the failure envelope is returned as a reply; {@link requestOk} throws it.
 */
export async function requestReply<T>(
  nc: NatsConnection,
  subject: string,
  body: unknown,
  replySchema: z.ZodType<T>,
  options: RequestReplyOptions,
): Promise<T> {
  const { service, timeoutMs } = options;
  const payload = body instanceof Uint8Array ? body : encodeJson(body);
  const limit = nc.info?.max_payload;
  if (limit !== undefined && payload.length > limit) {
    throw payloadTooLarge(
      `the request to the ${service} is ${payload.length} bytes; the server carries at most ${limit}`,
      { field: "request", bytes: payload.length, limit, subject },
    );
  }
  let data: Uint8Array;
  try {
    data = (await nc.request(subject, payload, { timeout: timeoutMs })).data;
  } catch (err) {
    if (err instanceof RequestError && err.isNoResponders()) {
      const known = await options.noResponders?.(err);
      if (known !== undefined) throw known;
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

/**
 * {@link requestReply} for replies whose failures come as `{ ok: false, error }` (or, from
 * older owner services, `{ error }`): the successful reply, or the refusal thrown as its typed
 * error.
 */
export async function requestOk<T extends object>(
  nc: NatsConnection,
  subject: string,
  body: unknown,
  replySchema: z.ZodType<T>,
  options: RequestReplyOptions,
): Promise<Exclude<T, { error: WireError }>> {
  const reply = await requestReply(nc, subject, body, replySchema, options);
  if ("error" in reply && (reply as { ok?: unknown }).ok !== true) {
    throw ToolmeshError.fromWire(reply.error as WireError);
  }
  return reply as Exclude<T, { error: WireError }>;
}
