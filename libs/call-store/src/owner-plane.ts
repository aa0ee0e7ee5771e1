import type { NatsConnection, RequestError } from "@nats-io/nats-core";
import type { z } from "zod";
import type {
  OwnerRegisterReply,
  OwnerRegisterRequest,
  OwnerService,
  ProgressEvent,
  Subjects,
  ToolMessage,
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
  encodeJson,
} from "@toolmesh/protocol";
import { ServerClock, publishEphemeral, requestOk } from "@toolmesh/nats";
import type { CallPlane, CallRecords, CallTarget, DeadLetterOut } from "./plane.js";

/** Options of {@link OwnerCallPlane}. Durations in ms. */
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
 * owner services, `{p}.v1.owner.{owner}.*`. It also registers and removes the owner's tools.
 */
export class OwnerCallPlane implements CallPlane {
  readonly clock = new ServerClock();
  readonly store: CallRecords = {
    get: async (call) => {
      const reply = await this.#ask(
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
  };
  readonly #nc: NatsConnection;
  readonly #subjects: Subjects;
  readonly #owner: string;
  readonly #timeoutMs: number;

  constructor(nc: NatsConnection, options: OwnerPlaneOptions) {
    this.#nc = nc;
    this.#subjects = options.subjects;
    this.#owner = options.owner;
    this.#timeoutMs = options.timeoutMs ?? 5_000;
  }

  /** Ends a call with `message` unless it ended already; the mesh reads the record itself. */
  async finalize(call: CallTarget, message: ToolMessage): Promise<boolean> {
    // A record an owner sends is not evidence: only the call is named.
    const reply = await this.#ask(
      "finalize",
      { call: callOf(call), message },
      OwnerFinalizeReplySchema,
    );
    return reply.won;
  }

  /** Sends a progress event of a running call; the mesh publishes it to the session. */
  publishProgress(call: CallTarget, event: ProgressEvent): void {
    publishEphemeral(this.#nc, this.#subjects.ownerService(this.#owner, "progress"), {
      call: callOf(call),
      event,
    });
  }

  /** Hands a work message nobody can run to the mesh's dead letters. */
  async deadLetter(letter: DeadLetterOut): Promise<void> {
    await this.#ask(
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
  }

  /** Registers a tool of the owner; the mesh creates its work consumer. */
  async register(
    definition: OwnerRegisterRequest["definition"],
    ackWaitMs?: number,
  ): Promise<OwnerRegisterReply & { status: string }> {
    return this.#ask(
      "register",
      { definition, ...(ackWaitMs === undefined ? {} : { ack_wait_ms: ackWaitMs }) },
      OwnerRegisterReplySchema,
      // A definition without a name goes to the bare subject, to be told what is wrong.
      typeof definition.name === "string" && definition.name !== ""
        ? this.#subjects.ownerRegister(this.#owner, definition.name)
        : undefined,
    );
  }

  /** Removes a tool of the owner; false when it was not registered. */
  async unregister(name: string): Promise<boolean> {
    return (await this.#ask("unregister", { name }, OwnerUnregisterReplySchema)).removed;
  }

  /** Asks `service`, on its bare subject or on `subject`; a refusal is thrown, typed. */
  #ask<T extends object>(
    service: OwnerService,
    body: unknown,
    schema: z.ZodType<T>,
    subject?: string,
  ): Promise<Exclude<T, { error: WireError }>> {
    const bare = this.#subjects.ownerService(this.#owner, service);
    return requestOk(this.#nc, subject ?? bare, body, schema, {
      timeoutMs: this.#timeoutMs,
      service: `owner service "${service}"`,
      noResponders: (err) => this.#noResponders(service, subject, err),
    });
  }

  /**
   * A register subject outside the owner's grants crosses no import: nobody answers it, while
   * the bare register subject, always imported, is answered when the mesh is up.
   */
  async #noResponders(
    service: OwnerService,
    subject: string | undefined,
    err: RequestError,
  ): Promise<ToolmeshError> {
    if (subject !== undefined && (await this.#meshAnswers(service))) {
      const owner = this.#owner;
      return new ToolmeshError(
        ErrorCode.PermissionDenied,
        `owner ${owner} was not granted this tool name: it may register names ${owner}.* and those granted by \`toolmesh auth config --owner ${owner}=NAME,…\``,
        { cause: err, retryable: false, details: { subject } },
      );
    }
    return new ToolmeshError(ErrorCode.Unavailable, "no resolver serves the owner services", {
      cause: err,
    });
  }

  /** Whether the mesh answers the bare subject of `service` (whatever it answers). */
  #meshAnswers(service: OwnerService): Promise<boolean> {
    return this.#nc
      .request(this.#subjects.ownerService(this.#owner, service), encodeJson({}), {
        timeout: this.#timeoutMs,
      })
      .then(
        () => true,
        () => false,
      );
  }
}

/** A call plane over the mesh's owner services, `{p}.v1.owner.{owner}.*`. */
export function ownerCallPlane(nc: NatsConnection, options: OwnerPlaneOptions): OwnerCallPlane {
  return new OwnerCallPlane(nc, options);
}

/** Only what names the call: an owner's copy of anything else is not evidence. */
function callOf(call: CallTarget): CallTarget {
  return {
    idempotency_key: call.idempotency_key,
    call_id: call.call_id,
    address: { tenant: call.address.tenant, session: call.address.session },
  };
}
