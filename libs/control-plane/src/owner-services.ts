import type { Msg, NatsConnection } from "@nats-io/nats-core";
import { z } from "zod";
import type { MeshCallPlane } from "@toolmesh/call-store";
import type { RegisterOutcome, ToolRegistry } from "@toolmesh/registry";
import type { Logger } from "@toolmesh/telemetry";
import type {
  CallRecord,
  OwnerService,
  SessionAddress,
  Subjects,
  ToolDefinition,
  ToolMessage,
} from "@toolmesh/protocol";
import {
  Defaults,
  ErrorCode,
  type OwnerDeadLetterRequest,
  OwnerDeadLetterRequestSchema,
  OwnerFinalizeRequestSchema,
  OwnerProgressRequestSchema,
  OwnerRecordRequestSchema,
  OwnerRegisterRequestSchema,
  OwnerUnregisterRequestSchema,
  ToolDefinitionSchema,
  ToolmeshError,
  isSubjectToken,
  malformedRequest,
} from "@toolmesh/protocol";
import type { RequestKind, RequestServer, StreamLimits } from "@toolmesh/nats";
import {
  answerRequest,
  serveRequests,
  ensureDurableConsumer,
  ensureStream,
  ownerAdvisoriesSpec,
  ownerWorkStreamSpec,
} from "@toolmesh/nats";

/** Options of {@link startOwnerServices}. Durations in ms. */
export interface OwnerServicesOptions {
  nc: NatsConnection;
  subjects: Subjects;
  plane: MeshCallPlane;
  /** The registry, watched: who owns a tool is read from its live copy. */
  registry: ToolRegistry;
  log: Logger;
  /** Ack wait of a work consumer whose registration names none, in ms. Default 10 000. */
  ackWaitMs?: number;
  /** Limits of the mesh's streams, which each owner's work stream takes too. */
  streamLimits?: StreamLimits | undefined;
  /**
   * Largest result an owner may end a call with, in bytes (`TOOLMESH_MAX_RESULT_BYTES`): a
   * larger `finalize` request is refused with `payload_too_large` before it is read (ADR 0049).
   * Default 512 KiB.
   */
  maxResultBytes?: number | undefined;
}

/** Room for what a request carries besides its payload (envelope, call, error details). */
const ENVELOPE_BYTES = 4 * 1024;

/**
 * The largest request of each owner service, in bytes (ADR 0049): a definition for
 * `register`, a final message for `finalize` (and a progress event, as large as a result may
 * be), a work message (base64) for `dead-letter`, and small requests for the rest.
 */
export function ownerRequestLimit(
  service: OwnerService,
  options: Pick<OwnerServicesOptions, "maxResultBytes" | "streamLimits">,
): number {
  switch (service) {
    case "register":
      return Defaults.maxToolDefinitionBytes + ENVELOPE_BYTES;
    case "finalize":
    case "progress":
      return (options.maxResultBytes ?? Defaults.maxResultBytes) + ENVELOPE_BYTES;
    case "dead-letter": {
      const message = options.streamLimits?.maxMessageBytes ?? Defaults.maxMessageBytes;
      return Math.ceil(message / 3) * 4 + ENVELOPE_BYTES;
    }
    default:
      return Defaults.maxSmallRequestBytes;
  }
}

/** The running owner services. */
export type OwnerServices = RequestServer;

/** An owner-service request's scope: the owner and service its subject names. */
interface OwnerTarget {
  owner: string;
  service: OwnerService;
  key?: string;
}

const QUEUE = "toolmesh-owner-services";

/**
 * Serves tool owners on `{p}.v1.owner.{owner}.{service}` (ADR 0031): executors and MCP bridges
 * in an owner's account, which has no JetStream, register their tools and end their calls
 * here. The owner is the subject's, never the body's: an owner's account imports only its own
 * subjects, so what an owner may do is decided here, against the registry: a call may be read,
 * progressed or ended only when its tool is the owner's, and a final message must name the
 * call it ends. Every request gets a typed answer (`{ ok: false, error }` for bad input).
 */
export function startOwnerServices(options: OwnerServicesOptions): OwnerServices {
  return serveRequests({
    nc: options.nc,
    subject: options.subjects.allOwnerServices,
    queue: QUEUE,
    ...ownerRequests(options),
  });
}

/** How owner-service requests are served: the scope is the owner and service of the subject. */
export function ownerRequests(options: OwnerServicesOptions): RequestKind<OwnerTarget> {
  const { subjects } = options;
  return {
    log: options.log,
    what: "owner service request",
    maxRequestBytes: (target) => ownerRequestLimit(target.service, options),
    scope: (msg) => {
      const target = subjects.parseOwnerSubject(msg.subject);
      if (target !== undefined) return target;
      throw new ToolmeshError(
        ErrorCode.InvalidRequest,
        `"${msg.subject}" names no owner service (${subjects.ownerService("{owner}", "register").replace(".register", "")}.{register,unregister,record,finalize,progress,dead-letter})`,
        { retryable: false, details: { subject: msg.subject } },
      );
    },
    handle: async (body, _msg, target) => {
      try {
        return await serve(options, target, body);
      } catch (err) {
        throw err instanceof z.ZodError
          ? malformedRequest(err, `malformed ${target.service} request`)
          : err;
      }
    },
  };
}

/** Answers one owner-service request (see {@link ownerRequests}). */
export function answerOwner(options: OwnerServicesOptions, msg: Msg): Promise<void> {
  return answerRequest(msg, ownerRequests(options));
}

async function serve(
  options: OwnerServicesOptions,
  target: OwnerTarget,
  body: unknown,
): Promise<unknown> {
  const { subjects, plane, registry } = options;
  const { owner, service } = target;
  switch (service) {
    case "register":
      return registerOwnTool(options, target, body);
    case "unregister": {
      const request = OwnerUnregisterRequestSchema.parse(body);
      return { removed: await registry.unregister(request.name, owner) };
    }
    case "record": {
      const request = OwnerRecordRequestSchema.parse(body);
      const stored = await plane.store.get(request);
      if (stored === undefined) return { record: null };
      ownCall(options, owner, stored.record);
      return { record: stored.record, revision: stored.revision };
    }
    case "finalize": {
      const { call, message } = OwnerFinalizeRequestSchema.parse(body);
      checkAddress(call);
      // The record this process stored when it routed the call saves a read: the mesh's own
      // write, checked like a record read, and changed only while it is still the stored one.
      const known = plane.store.recall(call);
      const verify = (record: CallRecord | undefined): void => {
        ownRecord(options, owner, call, record);
        matchesCall(record, message);
      };
      return { won: await plane.finalize(call, message, known, verify) };
    }
    case "progress":
      return progressOwnCall(options, owner, body);
    case "dead-letter": {
      const letter = OwnerDeadLetterRequestSchema.parse(body);
      ownTool(options, owner, letter.tool);
      const subject = subjects.work(letter.tool, owner);
      if (letter.subject !== subject) {
        throw new ToolmeshError(
          ErrorCode.InvalidRequest,
          `a dead letter of "${letter.tool}" must come from ${subject}, not ${letter.subject}`,
          { retryable: false, details: { subject: letter.subject } },
        );
      }
      await deadLetterOwnWork(options, owner, letter);
      return { ok: true };
    }
  }
}

/** Registers a tool of the owner, then makes its work stream and work consumer. */
async function registerOwnTool(
  options: OwnerServicesOptions,
  target: OwnerTarget,
  body: unknown,
): Promise<RegisterOutcome> {
  const { subjects, registry } = options;
  const { owner } = target;
  const request = OwnerRegisterRequestSchema.parse(body);
  const definition = ToolDefinitionSchema.parse({
    ...request.definition,
    owner,
    owner_account: true,
  });
  // The subject names the registry key, and the owner's account may publish only the keys
  // of the names its operator granted it (ADR 0041): the body must name the same tool.
  const key = subjects.registryKey(definition.name);
  if (target.key !== key) {
    throw new ToolmeshError(
      ErrorCode.InvalidRequest,
      `"${definition.name}" is registered on ${subjects.ownerRegister(owner, definition.name)}, not on ${subjects.ownerService(owner, "register")}${target.key === undefined ? "" : `.${target.key}`}`,
      { retryable: false, details: { name: definition.name } },
    );
  }
  const outcome = await registry.register(definition);
  if (outcome.status === "conflict") return outcome;
  await ensureWorkConsumer(
    options,
    definition,
    request.ack_wait_ms ?? options.ackWaitMs ?? Defaults.ackWaitMs,
  );
  return outcome;
}

/** Publishes a progress event of a call of one of the owner's tools, unless the call ended. */
async function progressOwnCall(
  options: OwnerServicesOptions,
  owner: string,
  body: unknown,
): Promise<{ ok: true }> {
  const { plane } = options;
  const { call, event } = OwnerProgressRequestSchema.parse(body);
  // As for finalize, the record this process stored saves a read; without it a progress
  // event sent before its call's final message could be published after it. A call ended
  // here has no kept record any more: it is read, and found done.
  const known = plane.store.peek(call);
  let stored: { record: CallRecord; revision: number };
  if (known === undefined) stored = await recordOf(options, owner, call);
  else {
    checkAddress(call);
    ownRecord(options, owner, call, known.record);
    stored = known;
  }
  matchesCall(stored.record, event);
  if (stored.record.state === "done") return { ok: true }; // ended: nobody waits for it
  plane.publishProgress(call, event);
  return { ok: true };
}

/**
 * Dead-letters a work message the owner really holds (ADR 0051): the letter is the message as
 * the mesh stored it in the owner's work stream, never the body the owner sent, so an owner can
 * neither plant a call it never received nor write more letters than the work it was given.
 * The message is deleted from the work stream once its letter is stored.
 */
async function deadLetterOwnWork(
  options: OwnerServicesOptions,
  owner: string,
  letter: OwnerDeadLetterRequest,
): Promise<void> {
  const { plane, subjects } = options;
  const stream = subjects.workStream(owner);
  const stored = await plane.jsm.streams.getMessage(stream, { seq: letter.seq });
  if (stored === null || stored.subject !== letter.subject) {
    throw new ToolmeshError(
      ErrorCode.InvalidRequest,
      `${stream} holds no work message ${letter.seq} on ${letter.subject}: only work the owner was given can be dead-lettered`,
      { retryable: false, details: { seq: letter.seq, subject: letter.subject } },
    );
  }
  await plane.deadLetter({
    tool: letter.tool,
    reason: letter.reason,
    stream,
    subject: stored.subject,
    seq: stored.seq,
    deliveries: letter.deliveries,
    data: stored.data,
    headers: stored.header,
  });
  await plane.jsm.streams.deleteMessage(stream, stored.seq).catch(() => false);
}

/** Refuses a call whose address does not name a tenant and a session by a token each. */
function checkAddress(call: { address: SessionAddress }): void {
  if (!isSubjectToken(call.address.tenant) || !isSubjectToken(call.address.session)) {
    throw new ToolmeshError(ErrorCode.InvalidRequest, "the call's address holds no token", {
      retryable: false,
      details: { address: call.address },
    });
  }
}

/** The stored record of a call of one of `owner`'s tools, or a typed refusal. */
async function recordOf(
  options: OwnerServicesOptions,
  owner: string,
  call: { idempotency_key: string; call_id: string; address: SessionAddress },
): Promise<{ record: CallRecord; revision: number }> {
  checkAddress(call);
  const stored = await options.plane.store.get(call);
  ownRecord(options, owner, call, stored?.record);
  return stored;
}

/** Refuses no record, a record of another owner's tool, or one of another call id. */
function ownRecord(
  options: OwnerServicesOptions,
  owner: string,
  call: { call_id: string },
  record: CallRecord | undefined,
): asserts record is CallRecord {
  if (record === undefined) {
    // Without its record nobody can tell whose call it is: nothing is published for it.
    throw new ToolmeshError(ErrorCode.InvalidRequest, "no record of that call", {
      retryable: false,
      details: { call_id: call.call_id },
    });
  }
  ownCall(options, owner, record);
  if (record.call_id !== call.call_id) {
    throw new ToolmeshError(
      ErrorCode.InvalidRequest,
      `the idempotency key names call ${record.call_id}, not ${call.call_id}`,
      { retryable: false, details: { call_id: call.call_id } },
    );
  }
}

/** Refuses a record whose tool is not `owner`'s. */
function ownCall(options: OwnerServicesOptions, owner: string, record: CallRecord): void {
  ownTool(options, owner, record.tool);
}

/** Refuses a tool that is not `owner`'s, by the registry's live copy. */
function ownTool(options: OwnerServicesOptions, owner: string, tool: string): ToolDefinition {
  const definition = options.registry.get(tool)?.definition;
  if (definition === undefined || definition.owner !== owner) {
    throw new ToolmeshError(
      ErrorCode.PermissionDenied,
      `tool "${tool}" is not a tool of owner ${owner}`,
      { retryable: false, details: { tool } },
    );
  }
  return definition;
}

/** Refuses a final message or progress event that names another call than its record. */
function matchesCall(
  record: CallRecord,
  message: Pick<ToolMessage, "tool_call_id" | "name" | "session_id">,
): void {
  if (
    message.tool_call_id !== record.call_id ||
    message.name !== record.tool ||
    message.session_id !== record.session_id
  ) {
    throw new ToolmeshError(
      ErrorCode.InvalidRequest,
      "tool_call_id, name and session_id must be those of the call",
      {
        retryable: false,
        details: {
          tool_call_id: message.tool_call_id,
          name: message.name,
          session_id: message.session_id,
        },
      },
    );
  }
}

/**
 * The owner's work stream and the tool's durable work consumer on it, both created by the mesh:
 * owners get no stream or consumer-create right (a consumer's deliver subject comes from the
 * request body, and would deliver into the mesh account).
 */
async function ensureWorkConsumer(
  options: OwnerServicesOptions,
  definition: ToolDefinition & { owner_account?: boolean },
  ackWaitMs: number,
): Promise<unknown> {
  const { subjects, plane } = options;
  const owner = definition.owner;
  await ensureStream(plane.jsm, ownerWorkStreamSpec(subjects, owner, options.streamLimits));
  // Its max-deliveries advisories are kept, so crash-looping work is dead-lettered (ADR 0041).
  // Without them such work still runs, and ends at its deadline: the tool is registered.
  await ensureStream(plane.jsm, ownerAdvisoriesSpec(subjects, owner, options.streamLimits)).catch(
    (err: unknown) =>
      options.log.warn(
        { err, owner },
        "cannot keep the owner's max-deliveries advisories: its crash-looping work ends at its deadline, not as a dead letter; regenerate the resolver's NATS permissions or run `toolmesh setup --owners`",
      ),
  );
  return ensureDurableConsumer(plane.jsm, {
    stream: subjects.workStream(owner),
    name: subjects.workConsumer(definition.name),
    filterSubject: subjects.work(definition.name, owner),
    ackWaitMs,
    // Crash redeliveries count as deliveries too: leave room beyond the policy's attempts.
    maxDeliver: definition.retry.max_attempts + 3,
    maxAckPending: 1_000,
  });
}
