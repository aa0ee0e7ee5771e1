import type { NatsConnection } from "@nats-io/nats-core";
import { RequestError, TimeoutError } from "@nats-io/nats-core";
import type { z } from "zod";
import type {
  OwnerRegisterReply,
  OwnerRegisterRequest,
  OwnerService,
  Subjects,
  WireError,
} from "@toolmesh/protocol";
import {
  ErrorCode,
  OwnerAckReplySchema,
  OwnerFinalizeReplySchema,
  OwnerRecordReplySchema,
  OwnerRegisterReplySchema,
  OwnerUnregisterReplySchema,
  ToolmeshError,
  decodeJson,
  encodeJson,
  ensureError,
} from "@toolmesh/protocol";
import { ServerClock } from "@toolmesh/nats";
import type { CallPlane, CallTarget } from "./plane.js";

/** Options of {@link ownerCallPlane}. Durations in ms. */
export interface OwnerPlaneOptions {
  subjects: Subjects;
  /** The tool owner whose account the connection is in. */
  owner: string;
  /** How long an owner service may take to answer, in ms. Default 5 000. */
  timeoutMs?: number;
}

/**
 * The call plane of an executor or bridge in a tool owner's account (ADR 0031), which has no
 * JetStream: records are read, calls ended, progress sent and dead letters kept by the mesh's
 * owner services. It also registers and removes the owner's tools.
 */
export interface OwnerCallPlane extends CallPlane {
  /** Registers a tool of the owner; the mesh creates its work consumer. */
  register(
    definition: OwnerRegisterRequest["definition"],
    ackWaitMs?: number,
  ): Promise<OwnerRegisterReply & { status: string }>;
  /** Removes a tool of the owner; false when it was not registered. */
  unregister(name: string): Promise<boolean>;
}

/** A call plane over the mesh's owner services, `{p}.v1.owner.{owner}.*`. */
export function ownerCallPlane(nc: NatsConnection, options: OwnerPlaneOptions): OwnerCallPlane {
  const { subjects, owner } = options;
  const timeoutMs = options.timeoutMs ?? 5_000;

  async function ask<T extends object>(
    service: OwnerService,
    body: unknown,
    schema: z.ZodType<T>,
    subject = subjects.ownerService(owner, service),
  ): Promise<Exclude<T, { error: WireError }>> {
    let data: Uint8Array;
    try {
      data = (
        await nc.request(subject, encodeJson(body), {
          timeout: timeoutMs,
        })
      ).data;
    } catch (err) {
      if (err instanceof RequestError && err.isNoResponders()) {
        // A register subject outside the owner's grants crosses no import: nobody answers it,
        // while the bare register subject, always imported, is answered when the mesh is up.
        if (subject !== subjects.ownerService(owner, service) && (await meshAnswers(service))) {
          throw new ToolmeshError(
            ErrorCode.PermissionDenied,
            `owner ${owner} was not granted this tool name: it may register names ${owner}.* and those granted by \`toolmesh auth config --owner ${owner}=NAME,…\``,
            { cause: err, retryable: false, details: { subject } },
          );
        }
        throw new ToolmeshError(ErrorCode.Unavailable, "no resolver serves the owner services", {
          cause: err,
        });
      }
      if (err instanceof TimeoutError) {
        throw new ToolmeshError(
          ErrorCode.Unavailable,
          `the owner service "${service}" did not answer within ${timeoutMs} ms`,
          { cause: err },
        );
      }
      throw ensureError(err, ErrorCode.Unavailable);
    }
    let reply: T;
    try {
      reply = schema.parse(decodeJson(data));
    } catch (err) {
      throw new ToolmeshError(
        ErrorCode.Internal,
        `the owner service "${service}" sent a reply of another shape`,
        { cause: err },
      );
    }
    if ("error" in reply) throw ToolmeshError.fromWire(reply.error as WireError);
    return reply as Exclude<T, { error: WireError }>;
  }

  /** Whether the mesh answers the bare subject of `service` (whatever it answers). */
  const meshAnswers = (service: OwnerService): Promise<boolean> =>
    nc.request(subjects.ownerService(owner, service), encodeJson({}), { timeout: timeoutMs }).then(
      () => true,
      () => false,
    );

  const callOf = (call: CallTarget): CallTarget => ({
    idempotency_key: call.idempotency_key,
    call_id: call.call_id,
    address: { tenant: call.address.tenant, session: call.address.session },
  });

  return {
    clock: new ServerClock(),
    store: {
      async get(call) {
        const reply = await ask(
          "record",
          {
            idempotency_key: call.idempotency_key,
            address: { tenant: call.address.tenant, session: call.address.session },
          },
          OwnerRecordReplySchema,
        );
        return reply.record === null
          ? undefined
          : { record: reply.record, revision: (reply as { revision: number }).revision };
      },
    },
    async finalize(call, message) {
      // The mesh reads the record itself: a record an owner sends is not evidence.
      const reply = await ask(
        "finalize",
        { call: callOf(call), message },
        OwnerFinalizeReplySchema,
      );
      return reply.won;
    },
    publishProgress(call, event) {
      nc.publish(
        subjects.ownerService(owner, "progress"),
        encodeJson({ call: callOf(call), event }),
      );
    },
    async deadLetter(letter) {
      await ask(
        "dead-letter",
        {
          tool: letter.tool,
          reason: letter.reason,
          subject: letter.subject,
          seq: letter.seq,
          deliveries: letter.deliveries,
          data: Buffer.from(letter.data).toString("base64"),
        },
        OwnerAckReplySchema,
      );
    },
    async register(definition, ackWaitMs) {
      return ask(
        "register",
        { definition, ...(ackWaitMs === undefined ? {} : { ack_wait_ms: ackWaitMs }) },
        OwnerRegisterReplySchema,
        // A definition without a name goes to the bare subject, to be told what is wrong.
        typeof definition.name === "string" && definition.name !== ""
          ? subjects.ownerRegister(owner, definition.name)
          : subjects.ownerService(owner, "register"),
      );
    },
    async unregister(name) {
      return (await ask("unregister", { name }, OwnerUnregisterReplySchema)).removed;
    },
  };
}
