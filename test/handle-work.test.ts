import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import type { JsMsg } from "@nats-io/jetstream";
import type { MeshCallPlane } from "@toolmesh/call-store";
import {
  argumentsHash,
  callRecordOf,
  knownRecordHeaders,
  openCallPlane,
} from "@toolmesh/call-store";
import {
  AttemptTelemetry,
  FreshWork,
  handleWork,
  toolDefinitionOf,
} from "@toolmesh/tool-host/internal";
import type { ToolModule } from "@toolmesh/tool-host";
import type { ServedTool, WorkDeps } from "@toolmesh/tool-host/internal";
import { ensureDurableConsumer, publishDurable, tracedHeaders } from "@toolmesh/nats";
import type { ResolvedCall, ToolMessage } from "@toolmesh/protocol";
import {
  RetryableError,
  callKey,
  createSubjects,
  errorToolMessage,
  ToolmeshError,
  ErrorCode,
} from "@toolmesh/protocol";
import { createLogger, toolmeshMetrics, trace } from "@toolmesh/telemetry";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { resolvedCall } from "./helpers/calls.js";

// The executor's handler of one work delivery, driven directly against a real server: what it
// runs, what it acknowledges, what it hands back, and when it trusts the record revision that
// the work message carries instead of reading the record (ADR 0027).
let server: NatsServerHandle;
let nc: NatsConnection;
let plane: MeshCallPlane;
const subjects = createSubjects({ prefix: "hw" });
const address = { tenant: "default", session: "s" };
const ACK_WAIT_MS = 1_000;
const WINDOW_MS = 2_000;

/** What the tool was asked to do on each run, in order. */
let runs: string[] = [];
const module: ToolModule = {
  name: "act",
  description: "Does what its argument says.",
  parameters: { type: "object", properties: { mode: { type: "string" } } },
  retry: {
    max_attempts: 3,
    initial_backoff_ms: 1_500,
    backoff_multiplier: 2,
    max_backoff_ms: 1_500,
    non_retryable_codes: [],
  },
  handler: (args) => {
    const mode = String(args.mode);
    runs.push(mode);
    if (mode === "flaky") throw new RetryableError("not yet");
    if (mode === "huge") return "x".repeat(5_000);
    return `did ${mode}`;
  },
};
const tool: ServedTool = { module, definition: toolDefinitionOf(module, "test"), presets: {} };

function depsWith(freshWork: FreshWork): WorkDeps {
  const tracer = trace.getTracer("test");
  return {
    nc,
    subjects,
    plane,
    log: createLogger({ service: "test", level: "silent" }),
    tracer,
    telemetry: new AttemptTelemetry(tracer, toolmeshMetrics()),
    toolkitContext: {},
    ackWaitMs: ACK_WAIT_MS,
    maxResultBytes: 4_000,
    running: new Map(),
    inHand: new Map(),
    shutdown: new AbortController(),
    freshWork,
  };
}

/** An executor that has listened to the abort broadcast for longer than the window. */
function listening(): FreshWork {
  const fresh = new FreshWork(WINDOW_MS);
  fresh.listening(Date.now() - 2 * WINDOW_MS);
  return fresh;
}

let n = 0;
function call(mode: string): ResolvedCall {
  return resolvedCall({
    id: `c${++n}`,
    tool: "act",
    address,
    timeoutMs: 30_000,
    arguments: { mode },
  });
}

/** Accepts and routes a call as the resolver does; `headers: false` as an older resolver. */
async function route(resolved: ResolvedCall, headers = true): Promise<void> {
  const record = callRecordOf(resolved, argumentsHash(JSON.stringify(resolved.arguments)));
  const accepted = await plane.store.accept(record);
  await publishDurable(plane.js, subjects.work("act"), resolved, {
    msgId: callKey(resolved.address, resolved.idempotency_key),
    headers: tracedHeaders(headers ? knownRecordHeaders(record, accepted) : undefined),
  });
}

async function next(expiresMs = 3_000): Promise<JsMsg | null> {
  const consumer = await plane.js.consumers.get(
    subjects.streams.work,
    subjects.workConsumer("act"),
  );
  return consumer.next({ expires: expiresMs });
}

async function delivered(): Promise<JsMsg> {
  const msg = await next();
  if (msg === null) throw new Error("no work was delivered");
  return msg;
}

/** Messages left in the work stream (a work queue: acknowledged ones are gone). */
async function workLeft(): Promise<number> {
  await nc.flush();
  return (await plane.jsm.streams.info(subjects.streams.work)).state.messages;
}

async function stored(resolved: ResolvedCall): Promise<ToolMessage | undefined> {
  return (await plane.store.get(resolved))?.record.result;
}

function cancelledMessage(resolved: ResolvedCall): ToolMessage {
  return errorToolMessage(
    { tool_call_id: resolved.call_id, name: "act", session_id: "s" },
    new ToolmeshError(ErrorCode.Cancelled, "cancelled"),
  );
}

/** Makes the consumer's drained mark: the first delivery with nothing behind it. */
async function drain(deps: WorkDeps): Promise<void> {
  const first = call("warm");
  await route(first);
  await handleWork(deps, tool, await delivered());
}

beforeAll(async () => {
  server = await startNatsServer();
  nc = await connect({ servers: server.url });
  plane = await openCallPlane(nc, { subjects });
  await ensureDurableConsumer(plane.jsm, {
    stream: subjects.streams.work,
    name: subjects.workConsumer("act"),
    filterSubject: subjects.work("act"),
    ackWaitMs: ACK_WAIT_MS,
    maxDeliver: 6,
    maxAckPending: 100,
  });
});

beforeEach(() => {
  runs = [];
});

afterAll(async () => {
  await nc?.close();
  await server?.stop();
});

describe("handleWork", () => {
  it("runs a call, ends it with its result and acknowledges its work", async () => {
    const deps = depsWith(listening());
    const resolved = call("one");
    await route(resolved);
    await handleWork(deps, tool, await delivered());
    expect(runs).toEqual(["one"]);
    expect((await stored(resolved))?.content).toBe("did one");
    expect(await workLeft()).toBe(0);
  });

  it("starts an attempt's timeout only once the tool is ready, so a restart does not eat it", async () => {
    // A tool whose backing server comes up 600 ms from now, with a 300 ms attempt timeout:
    // counted from the start, the attempt would time out waiting for the server.
    const up = new Promise<void>((resolve) => setTimeout(resolve, 600));
    const restarting: ToolModule = {
      ...module,
      timeoutMs: 300,
      ready: () => up,
      handler: async () => {
        await up;
        return "served after the restart";
      },
    };
    const served: ServedTool = {
      module: restarting,
      definition: toolDefinitionOf(restarting, "test"),
      presets: {},
    };
    const resolved = call("restart");
    await route(resolved);
    await handleWork(depsWith(listening()), served, await delivered());
    expect(await stored(resolved)).toMatchObject({
      content: "served after the restart",
      attempts: 1,
    });
  });

  it("does not run a call whose record already ended, and acknowledges its work", async () => {
    const deps = depsWith(listening());
    // Sent by a resolver that puts no revision on its work: the executor reads the record.
    const resolved = call("never");
    await route(resolved, false);
    await plane.store.finish(resolved, cancelledMessage(resolved));
    await handleWork(deps, tool, await delivered());
    expect(runs).toEqual([]);
    expect((await stored(resolved))?.error?.code).toBe("cancelled");
    expect(await workLeft()).toBe(0);
  });

  it("hands a retryable failure back with a delay, and runs it again after that", async () => {
    const deps = depsWith(listening());
    const resolved = call("flaky");
    await route(resolved);
    await handleWork(deps, tool, await delivered());
    expect(runs).toEqual(["flaky"]);
    // Not acknowledged, not ended, and not delivered again before its delay.
    expect((await plane.store.get(resolved))?.record.state).toBe("accepted");
    expect(await next(1_000)).toBeNull();
    const again = await delivered();
    expect(again.info.deliveryCount).toBe(2);
    again.ack();
  });

  it("ends the call with payload_too_large when the result is too large", async () => {
    const deps = depsWith(listening());
    const resolved = call("huge");
    await route(resolved);
    await handleWork(deps, tool, await delivered());
    expect(runs).toEqual(["huge"]);
    expect(await stored(resolved)).toMatchObject({
      error: { code: "payload_too_large", details: { bytes: expect.any(Number), limit: 4_000 } },
    });
    expect(await workLeft()).toBe(0);
  });

  it("does not run a redelivered call whose first run finished but was not acknowledged", async () => {
    const deps = depsWith(listening());
    const resolved = call("once");
    await route(resolved);
    const first = await delivered();
    // The executor dies between ending the call and acknowledging its work.
    const unacked = new Proxy(first, {
      get(target, prop) {
        if (prop === "ack") return () => undefined;
        const value: unknown = Reflect.get(target, prop, target);
        return typeof value === "function" ? (value as () => unknown).bind(target) : value;
      },
    });
    await handleWork(deps, tool, unacked);
    expect(runs).toEqual(["once"]);
    const again = await delivered();
    expect(again.info.deliveryCount).toBe(2);
    await handleWork(depsWith(listening()), tool, again);
    expect(runs).toEqual(["once"]);
    expect((await stored(resolved))?.content).toBe("did once");
    expect(await workLeft()).toBe(0);
  });
});

describe("a young first delivery with the record's revision", () => {
  it("runs without reading; a call that ended meanwhile keeps its first final message", async () => {
    const deps = depsWith(listening());
    await drain(deps);
    runs = [];
    const resolved = call("late");
    await route(resolved);
    // Cancelled while queued, and this executor did not hear the abort broadcast: the one case
    // where the handler runs (ADR 0027); the compare-and-set still drops its result.
    await plane.store.finish(resolved, cancelledMessage(resolved));
    await handleWork(deps, tool, await delivered());
    expect(runs).toEqual(["late"]);
    expect((await stored(resolved))?.error?.code).toBe("cancelled");
    expect(await workLeft()).toBe(0);
  });

  it("is read first when the abort broadcast named its call, and is not run", async () => {
    const deps = depsWith(listening());
    await drain(deps);
    runs = [];
    const resolved = call("aborted");
    await route(resolved);
    await plane.store.finish(resolved, cancelledMessage(resolved));
    deps.freshWork.aborted(callKey(resolved.address, resolved.idempotency_key));
    await handleWork(deps, tool, await delivered());
    expect(runs).toEqual([]);
    expect(await workLeft()).toBe(0);
  });

  it("is read first while the executor has listened for less than the window", async () => {
    const fresh = new FreshWork(WINDOW_MS);
    fresh.listening();
    const deps = depsWith(fresh);
    await drain(deps);
    runs = [];
    const resolved = call("early");
    await route(resolved);
    await plane.store.finish(resolved, cancelledMessage(resolved));
    await handleWork(deps, tool, await delivered());
    expect(runs).toEqual([]);
  });

  it("is read first until the consumer was once drained after listening began", async () => {
    const deps = depsWith(listening());
    const resolved = call("backlog");
    await route(resolved);
    await plane.store.finish(resolved, cancelledMessage(resolved));
    await handleWork(deps, tool, await delivered());
    expect(runs).toEqual([]);
  });
});
