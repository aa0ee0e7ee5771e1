import type { NatsConnection } from "@nats-io/nats-core";
import { z } from "zod";
import type { Subjects } from "@toolmesh/protocol";
import { ErrorCode, ToolmeshError } from "@toolmesh/protocol";
import type { RequestServer, ServeRequestsOptions } from "@toolmesh/nats";
import { requestOk, serveRequests } from "@toolmesh/nats";
import { AuditEventType } from "./events.js";
import type { BatchOutcome, BatchWriter, QueuedEvent } from "./writer.js";

// Services other than the resolvers hand their events to the resolvers, which chain them
// (ADR 0064): one writer kind per tenant's chain keeps it free of races between services.

const ForwardedEventSchema = z
  .object({
    id: z.string().min(1).max(1_024),
    by: z.string().min(1).max(1_024),
    type: z.enum(Object.values(AuditEventType) as [AuditEventType, ...AuditEventType[]]),
    call_id: z.string().optional(),
    session: z.string().optional(),
    tool: z.string().optional(),
    at: z.number(),
    data: z.record(z.string(), z.unknown()),
  })
  .strict();

const ForwardedEventsSchema = z.object({ events: z.array(ForwardedEventSchema).min(1) }).strict();

/** The resolvers' answer: how many of the events, from the first, are in the chain. */
const ForwardReplySchema = z.object({ written: z.number().int().nonnegative() });

/** Most bytes of events handed on in one request. */
const FORWARD_MAX_BYTES = 256 * 1_024;

/**
 * How long a request waits for the resolvers to write what it handed on. A resolver killed
 * holding it never answers: the events are handed on again (kept once by their ids) after this
 * long, which also holds up a call's end in `required` mode (at most 5 s).
 */
const FORWARD_TIMEOUT_MS = 3_000;

/**
 * Writes a tenant's events by handing them to the resolvers (`{p}.v1.audit-write.{tenant}`),
 * which append them to the chain and answer how many are written. What is not written is
 * retried by the trail, with the same ids: an event written twice is kept once by the stream.
 */
export class ForwardingWriter implements BatchWriter {
  constructor(
    private readonly nc: NatsConnection,
    private readonly subjects: Subjects,
  ) {}

  async write(tenant: string, batch: readonly QueuedEvent[]): Promise<BatchOutcome> {
    // Each event serialized once: its size bounds the request, its text makes the body.
    const events: string[] = [];
    let bytes = 0;
    for (const { id, by, event } of batch) {
      const json = JSON.stringify({ id, by, ...event });
      if (events.length > 0 && bytes + json.length > FORWARD_MAX_BYTES) break;
      events.push(json);
      bytes += json.length;
    }
    try {
      const { written } = await requestOk(
        this.nc,
        this.subjects.auditWrite(tenant),
        Buffer.from(`{"events":[${events.join(",")}]}`, "utf8"),
        ForwardReplySchema,
        { timeoutMs: FORWARD_TIMEOUT_MS, service: "resolver" },
      );
      if (written >= events.length) return { written: events.length };
      const err = new Error(
        `the resolvers wrote ${written} of ${events.length} audit events of tenant ${tenant}`,
      );
      return { written, failure: { err } };
    } catch (err) {
      // `unavailable`: no resolver took the request (none listening, none answering in time,
      // the connection down); a resolver's answer that it could not write them is above.
      const unanswered = err instanceof ToolmeshError && err.code === ErrorCode.Unavailable;
      return { written: 0, failure: unanswered ? { err, unanswered } : { err } };
    }
  }
}

/** What {@link serveAuditWrites} writes with: the resolver's own trail. */
export interface ChainingTrail {
  tryRecord(tenant: string, event: z.infer<typeof ForwardedEventSchema>): Promise<boolean>;
}

/**
 * The resolvers' side of {@link ForwardingWriter}: takes a tenant's events handed on, appends
 * them to the chain after the events this process recorded before, and answers once their
 * first write is done with how many, from the first, were written. What was not is withdrawn
 * here and retried by the service that handed it on.
 */
export function serveAuditWrites(
  nc: NatsConnection,
  subjects: Subjects,
  trail: ChainingTrail,
  log: ServeRequestsOptions["log"],
): RequestServer {
  const stem = subjects.allAuditWrites.slice(0, -1);
  return serveRequests({
    nc,
    subject: subjects.allAuditWrites,
    queue: "toolmesh-audit-write",
    log,
    what: "audit write request",
    // Answered only on the inboxes of the services that hand events on: executors, bridges,
    // and `toolmesh dev`, which runs every actor on one connection.
    replyPrefixes: ["executor", "mcp-bridge", "dev"].map(
      (role) => `${subjects.inboxPrefix(role)}.`,
    ),
    scope: (msg) => msg.subject.slice(stem.length),
    handle: async (body, _msg, tenant) => {
      const { events } = ForwardedEventsSchema.parse(body);
      const written = await Promise.all(events.map((event) => trail.tryRecord(tenant, event)));
      const failed = written.indexOf(false);
      return { written: failed < 0 ? written.length : failed };
    },
  });
}
