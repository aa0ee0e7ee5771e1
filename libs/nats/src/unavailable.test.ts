import { describe, expect, it } from "vitest";
import {
  NoRespondersError,
  PermissionViolationError,
  RequestError,
  TimeoutError,
} from "@nats-io/nats-core";
import { JetStreamApiError } from "@nats-io/jetstream";
import { StillUnavailableError, retryWhileUnavailable, unavailableKind } from "./unavailable.js";

const apiError = (code: number, description: string): JetStreamApiError =>
  new JetStreamApiError({ code: 503, err_code: code, description });

describe("unavailableKind", () => {
  it("names the troubles a leader election causes, also behind a wrapping error", () => {
    expect(unavailableKind(new TimeoutError())).toBe("timeout");
    const noResponders = new RequestError("no responders", {
      cause: new NoRespondersError("$JS.API.CONSUMER.INFO.S.c"),
    });
    expect(unavailableKind(new Error("jetstream is not enabled", { cause: noResponders }))).toBe(
      "no responders",
    );
    expect(unavailableKind(apiError(10008, "JetStream system temporarily unavailable"))).toBe(
      "unavailable",
    );
    expect(
      unavailableKind(
        new Error("cannot read consumer", { cause: apiError(10014, "consumer not found") }),
      ),
    ).toBe("consumer not found");
  });

  it("leaves out what waiting cannot heal", () => {
    expect(unavailableKind(apiError(10059, "stream not found"))).toBeUndefined();
    expect(
      unavailableKind(
        new PermissionViolationError("denied", "publish", "$JS.API.CONSUMER.INFO.S.c"),
      ),
    ).toBeUndefined();
    expect(unavailableKind(new Error("bad request"))).toBeUndefined();
    expect(unavailableKind("timeout")).toBeUndefined();
  });
});

describe("retryWhileUnavailable", () => {
  it("tries again while the trouble passes, telling each kind once", async () => {
    const failures = [
      new TimeoutError(),
      new TimeoutError(),
      apiError(10014, "consumer not found"),
    ];
    const told: string[] = [];
    const result = await retryWhileUnavailable(
      () => {
        const failure = failures.shift();
        return failure === undefined ? Promise.resolve("read") : Promise.reject(failure);
      },
      { what: "read consumer c", onRetry: (kind) => told.push(kind) },
    );
    expect(result).toBe("read");
    expect(told).toEqual(["timeout", "consumer not found"]);
  });

  it("gives up at once on another error, and with one line once the budget is spent", async () => {
    const refused = apiError(10059, "stream not found");
    await expect(retryWhileUnavailable(() => Promise.reject(refused), { what: "x" })).rejects.toBe(
      refused,
    );
    await expect(
      retryWhileUnavailable(() => Promise.reject(new TimeoutError()), {
        what: "read consumer c of stream S",
        budgetMs: 100,
      }),
    ).rejects.toThrow(/^cannot read consumer c of stream S within 100 ms \(timeout: /);
  });

  it("does not try again what gave up after its own budget, nor name it twice", async () => {
    let inner = 0;
    const gaveUp = await retryWhileUnavailable(
      () => {
        inner++;
        return retryWhileUnavailable(() => Promise.reject(new TimeoutError()), {
          what: "load the tool registry",
          budgetMs: 100,
        });
      },
      { what: "open the tool registry", budgetMs: 60_000 },
    ).catch((err: unknown) => err);
    expect(inner).toBe(1);
    expect(gaveUp).toBeInstanceOf(StillUnavailableError);
    expect((gaveUp as Error).message).toMatch(
      /^cannot load the tool registry within 100 ms \(timeout: /,
    );
    expect(unavailableKind(gaveUp)).toBeUndefined();
  });
});
