import { describe, expect, it } from "vitest";
import { Readiness } from "./health.js";

describe("Readiness", () => {
  it("is ready when every named check is ok, and names each in the report", () => {
    const readiness = new Readiness();
    let connected = true;
    readiness.set("nats", () => ({ ok: connected }));
    readiness.set("mcp:files", () => ({ ok: true, detail: { state: "ready" } }));
    expect(readiness.report()).toEqual({
      status: "ready",
      checks: { nats: { ok: true }, "mcp:files": { ok: true, detail: { state: "ready" } } },
    });
    connected = false;
    expect(readiness.report().status).toBe("unavailable");
  });

  it("counts a check that throws as not ok, and removes a check", () => {
    const readiness = new Readiness();
    const remove = readiness.set("broken", () => {
      throw new Error("boom");
    });
    expect(readiness.report()).toEqual({
      status: "unavailable",
      checks: { broken: { ok: false, detail: "boom" } },
    });
    remove();
    expect(readiness.report()).toEqual({ status: "ready", checks: {} });
  });
});
