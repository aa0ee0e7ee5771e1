import { describe, expect, it } from "vitest";
import { NoRespondersError, RequestError } from "@nats-io/nats-core";
import { JetStreamApiError } from "@nats-io/jetstream";
import { ErrorCode, Header } from "@toolmesh/protocol";
import { finalHeaders, publishError } from "./publish.js";

describe("finalHeaders", () => {
  it("names the tool when a header can carry its name, and leaves it out otherwise", () => {
    expect(finalHeaders({ name: "fx.echo" }).get(Header.Tool)).toBe("fx.echo");
    for (const name of ["bad\nname", "", "é", "x".repeat(257)])
      expect(finalHeaders({ name }).has(Header.Tool)).toBe(false);
  });
});

describe("publishError", () => {
  it("reports a value JSON.stringify cannot encode without the engine's words", () => {
    let overflow: unknown;
    try {
      const deep = JSON.parse(`${"[".repeat(100_000)}${"]".repeat(100_000)}`) as unknown;
      JSON.stringify(deep);
    } catch (err) {
      overflow = err;
    }
    expect(overflow).toBeInstanceOf(RangeError);
    const error = publishError(overflow, "a.subject");
    expect(error.toWire()).toEqual({
      code: ErrorCode.Internal,
      message: "message cannot be encoded as JSON: it nests too deeply or is too large",
      retryable: false,
      details: { subject: "a.subject" },
    });
  });

  it("says that no stream stores a subject when JetStream has no responder for it", () => {
    // What nats.js throws for a publish no stream takes: its 503 behind "jetstream is not enabled".
    const noStream = new Error("jetstream is not enabled", {
      cause: new RequestError("no responders: 'other.v1.calls.t.s'", {
        cause: new NoRespondersError("other.v1.calls.t.s"),
      }),
    });
    const error = publishError(noStream, "other.v1.calls.t.s");
    // The same for the 503 on its own.
    const bare = publishError(new NoRespondersError("other.v1.calls.t.s"), "other.v1.calls.t.s");
    expect(bare.message).toBe(error.message);
    expect(error.code).toBe(ErrorCode.Unavailable);
    expect(error.retryable).toBe(true);
    expect(error.message).toBe(
      "no stream took the message on other.v1.calls.t.s: none stores that subject (check the subject prefix and the tenant; toolmesh setup makes the streams), or its leader is being elected",
    );
  });

  // The bodies nats-server 2.9.10 and 2.15.1 answer with (same on both).
  it("tells a session's full share of the calls stream from a full stream", () => {
    const perSession = publishError(
      new JetStreamApiError({
        code: 503,
        err_code: 10077,
        description: "maximum messages per subject exceeded",
      }),
      "tm.v1.calls.a.s",
    ).toWire();
    expect(perSession).toMatchObject({
      code: ErrorCode.Overloaded,
      retryable: true,
      details: { subject: "tm.v1.calls.a.s", limit: "queued_per_session", retry_after_ms: 1000 },
    });
    const full = publishError(
      new JetStreamApiError({
        code: 503,
        err_code: 10077,
        description: "maximum messages exceeded",
      }),
      "tm.v1.calls.a.s",
    ).toWire();
    expect(full).toMatchObject({
      code: ErrorCode.Overloaded,
      retryable: true,
      details: { subject: "tm.v1.calls.a.s", limit: "queued", retry_after_ms: 1000 },
    });
    const bytes = publishError(
      new JetStreamApiError({ code: 503, err_code: 10077, description: "maximum bytes exceeded" }),
      "tm.v1.calls.a.s",
    ).toWire();
    expect(bytes).toMatchObject({
      code: ErrorCode.Overloaded,
      retryable: true,
      details: { subject: "tm.v1.calls.a.s", limit: "stored_bytes", retry_after_ms: 1000 },
    });
  });
});
