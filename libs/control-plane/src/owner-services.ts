import type { Msg, NatsConnection, Subscription } from "@nats-io/nats-core";
import { z } from "zod";
import type { MeshCallPlane } from "@toolmesh/call-store";
import type { ToolRegistry } from "@toolmesh/registry";
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
  OwnerDeadLetterRequestSchema,
  OwnerFinalizeRequestSchema,
  OwnerProgressRequestSchema,
  OwnerRecordRequestSchema,
  OwnerRegisterRequestSchema,
  OwnerUnregisterRequestSchema,
  ToolDefinitionSchema,
  ToolmeshError,
  decodeJson,
  encodeJson,
  ensureError,
  isSubjectToken,
} from "@toolmesh/protocol";
import type { StreamLimits } from "@toolmesh/nats";
import {
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
}

/** The running owner services. */
export interface OwnerServices {
  stop(): void;
}

const QUEUE = "toolmesh-owner-services";

/**
 * Serves tool owners on `{p}.v1.owner.{owner}.{service}` (ADR 0031): executors and MCP bridges
 * in an owner's account, which has no JetStream, register their tools and end their calls
 * here. The owner is the subject's, never the body's: an owner's account imports only its own
 * subjects, so what an owner may do is decided here, against the registry: a call may be read,
 * progressed or ended only when its tool is the owner's, and a final message must name the
 * call it ends. Every request gets a typed answer (`{ error }` for bad input).
 */
export function startOwnerServices(options: OwnerServicesOptions): OwnerServices {
  const { nc, subjects, log } = options;
  const sub: Subscription = nc.subscribe(subjects.allOwnerServices, {
    queue: QUEUE,
    callback: (err, msg) => {
      if (err !== null) {
        log.error({ err }, "owner services subscription failed");
        return;
      }
      void answerOwner(options, msg);
    },
  });
  return { stop: () => sub.unsubscribe() };
}

/** Answers one owner-service request. */
export async function answerOwner(options: OwnerServicesOptions, msg: Msg): Promise<void> {
  const { subjects, log } = options;
  const target = subjects.parseOwnerSubject(msg.subject);
  let reply: unknown;
  try {
    if (target === undefined) {
      throw new ToolmeshError(
        ErrorCode.InvalidRequest,
        `"${msg.subject}" names no owner service (${subjects.ownerService("{owner}", "register").replace(".register", "")}.{register,unregister,record,finalize,progress,dead-letter})`,
        { retryable: false, details: { subject: msg.subject } },
      );
    }
    reply = await serve(options, target, msg.data);
  } catch (err) {
    const error = ensureError(
      err instanceof z.ZodError
        ? new ToolmeshError(
            ErrorCode.InvalidRequest,
            `malformed ${target?.service ?? "owner"} request: ${z.prettifyError(err)}`,
            { retryable: false },
          )
        : err,
    );
    if (error.code === ErrorCode.Internal || error.code === ErrorCode.Unavailable)
      log.warn({ err: error, subject: msg.subject }, "owner service request failed");
    reply = { error: error.toWire() };
  }
  if (msg.reply) msg.respond(encodeJson(reply));
}

async function serve(
  options: OwnerServicesOptions,
  target: { owner: string; service: OwnerService; key?: string },
  data: Uint8Array,
): Promise<unknown> {
  const { subjects, plane, registry } = options;
  const { owner, service } = target;
  const body = decodeBody(data);
  switch (service) {
    case "register": {
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
    case "progress": {
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
      await plane.deadLetter({
        ...letter,
        stream: subjects.workStream(owner),
        data: Buffer.from(letter.data, "base64"),
      });
      return { ok: true };
    }
  }
}

function decodeBody(data: Uint8Array): unknown {
  try {
    return decodeJson(data);
  } catch (err) {
    throw new ToolmeshError(ErrorCode.InvalidRequest, "the request body is not JSON", {
      retryable: false,
      cause: err,
    });
  }
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
