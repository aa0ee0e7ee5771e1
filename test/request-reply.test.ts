// The client's one request/reply helper against a real server, and the three callers that use
// it keeping their own error behaviour: dry runs answer `{ ok: false }`, cancellations answer
// `state: "unknown"`, schema-expander requests throw.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { z } from "zod";
import { ToolmeshClient, requestReply } from "@toolmesh/client";
import { ErrorCode, ToolmeshError, encodeJson } from "@toolmesh/protocol";
import { serveRequests } from "@toolmesh/nats";
import { createLogger } from "@toolmesh/telemetry";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";

const ReplySchema = z.object({ echoed: z.string() });

let server: NatsServerHandle;
let nc: NatsConnection;

beforeAll(async () => {
  server = await startNatsServer();
  nc = await connect({ servers: server.url });
  // Answers with what each subject's name asks for.
  nc.subscribe("rr.good", {
    callback: (_err, msg) => {
      msg.respond(encodeJson({ echoed: msg.json<{ text: string }>().text }));
    },
  });
  nc.subscribe("rr.not-json", {
    callback: (_err, msg) => {
      msg.respond("{half");
    },
  });
  nc.subscribe("rr.other-shape", {
    callback: (_err, msg) => {
      msg.respond(encodeJson({ x: 1 }));
    },
  });
  nc.subscribe("rr.silent", { callback: () => undefined });
  await nc.flush();
});

afterAll(async () => {
  await nc?.close();
  await server?.stop();
});

/** The typed error `promise` rejects with. */
async function failure(promise: Promise<unknown>): Promise<ToolmeshError> {
  const err = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(ToolmeshError);
  return err as ToolmeshError;
}

const options = { timeoutMs: 1_000, service: "test service" };

describe("requestReply", () => {
  it("returns a good reply parsed", async () => {
    expect(await requestReply(nc, "rr.good", { text: "hi" }, ReplySchema, options)).toEqual({
      echoed: "hi",
    });
  });

  it("sends a body given as JSON bytes as it is", async () => {
    const bytes = Buffer.from('{"text":"as sent"}', "utf8");
    expect(await requestReply(nc, "rr.good", bytes, ReplySchema, options)).toEqual({
      echoed: "as sent",
    });
  });

  it("names who is not running when nobody listens", async () => {
    const error = await failure(requestReply(nc, "rr.nobody", {}, ReplySchema, options));
    expect(error.toWire()).toEqual({
      code: ErrorCode.Unavailable,
      message: "no test service is running",
      retryable: true,
    });
  });

  it("gives up after the timeout when nobody answers", async () => {
    const error = await failure(
      requestReply(nc, "rr.silent", {}, ReplySchema, { ...options, timeoutMs: 200 }),
    );
    expect(error.code).toBe(ErrorCode.Unavailable);
    expect(error.message).toBe("the test service did not answer within 200 ms");
  });

  it("reports a reply that is not JSON, or not of the reply's shape, as internal", async () => {
    const notJson = await failure(requestReply(nc, "rr.not-json", {}, ReplySchema, options));
    expect([notJson.code, notJson.message]).toEqual([
      ErrorCode.Internal,
      "the test service sent a reply that is not JSON",
    ]);
    const other = await failure(requestReply(nc, "rr.other-shape", {}, ReplySchema, options));
    expect([other.code, other.message]).toEqual([
      ErrorCode.Internal,
      "the test service sent a reply of another shape",
    ]);
  });
});

describe("the client's requests with no service running", () => {
  const client = (): ToolmeshClient => new ToolmeshClient(nc, { requestTimeoutMs: 1_000 });

  it("a dry run answers ok: false, unavailable", async () => {
    const reply = await client().resolve("s", { name: "echo", arguments: { text: "hi" } });
    expect(reply).toEqual({
      ok: false,
      error: { code: ErrorCode.Unavailable, message: "no resolver is running", retryable: true },
    });
  });

  it("a cancellation answers state unknown with the error", async () => {
    const session = client().session("s");
    try {
      expect(await session.cancel("call-1")).toEqual({
        cancelled: false,
        state: "unknown",
        error: { code: ErrorCode.Unavailable, message: "no resolver is running", retryable: true },
      });
    } finally {
      session.close();
    }
  });

  it("a catalog request throws unavailable", async () => {
    const error = await failure(client().catalog());
    expect([error.code, error.message]).toEqual([
      ErrorCode.Unavailable,
      "no schema expander is running",
    ]);
  });
});

describe("serveRequests", () => {
  const log = createLogger({ service: "test", level: "silent" });
  const EchoSchema = z.object({ text: z.string() });
  const refusal = (error: unknown) => ({ ok: false, error });

  it("answers with the handler's reply and maps bad bodies to invalid_request", async () => {
    const server = serveRequests({
      nc,
      subject: "sr.echo",
      queue: "sr",
      log,
      refusal,
      what: "echo request",
      handle: (body) => ({ ok: true, text: EchoSchema.parse(body).text }),
    });
    await nc.flush();
    try {
      const ask = async (data: string | Uint8Array) =>
        (await nc.request("sr.echo", data, { timeout: 2_000 })).json();
      expect(await ask(encodeJson({ text: "hi" }))).toEqual({ ok: true, text: "hi" });
      expect(await ask("{half")).toEqual({
        ok: false,
        error: { code: "invalid_request", message: "echo request is not JSON", retryable: false },
      });
      expect(await ask(encodeJson({ text: 5 }))).toMatchObject({
        ok: false,
        error: {
          code: "invalid_request",
          retryable: false,
          details: { issues: [{ path: "/text" }] },
        },
      });
    } finally {
      await server.stop(1_000);
    }
  });

  it("answers the requests in hand before stop resolves, and takes no new ones", async () => {
    let release: () => void = () => undefined;
    const gate = new Promise<void>((resolve) => (release = resolve));
    let started: () => void = () => undefined;
    const begun = new Promise<void>((resolve) => (started = resolve));
    const server = serveRequests({
      nc,
      subject: "sr.slow",
      queue: "sr",
      log,
      refusal,
      handle: async () => {
        started();
        await gate;
        return { ok: true };
      },
    });
    await nc.flush();
    const reply = nc.request("sr.slow", encodeJson({}), { timeout: 5_000 });
    await begun;
    expect(server.inFlight).toBe(1);
    let stopped = false;
    const stopping = server.stop(5_000).then(() => (stopped = true));
    await nc.flush();
    expect(stopped).toBe(false);
    release();
    await stopping;
    expect((await reply).json()).toEqual({ ok: true });
    expect(server.inFlight).toBe(0);
    await expect(nc.request("sr.slow", encodeJson({}), { timeout: 1_000 })).rejects.toThrow();
  });
});
