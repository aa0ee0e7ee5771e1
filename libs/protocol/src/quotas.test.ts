import { describe, expect, it } from "vitest";
import type { ToolmeshError } from "./errors.js";
import { parseQuota, quotaKey } from "./quotas.js";

describe("quotaKey", () => {
  it("keys a tenant, a tenant's tool and a tenant's agent apart, with safe tokens", () => {
    expect(quotaKey({ tenant: "acme" })).toBe("acme");
    expect(quotaKey({ tenant: "acme", tool: "files.read" })).toBe("acme.tool.files=2eread");
    expect(quotaKey({ tenant: "a.b", agent: "bot" })).toBe("a=2eb.agent.bot");
  });

  it("refuses a scope naming a tool and an agent at once", () => {
    expect(() => quotaKey({ tenant: "acme", tool: "t", agent: "a" })).toThrow(
      /not to a tool and an agent/,
    );
  });
});

describe("parseQuota", () => {
  it("accepts every limit", () => {
    const quota = { max_in_flight: 3, max_queued: 0, rate: 2.5, burst: 5, daily: 100, weight: 2 };
    expect(parseQuota(quota)).toEqual(quota);
  });

  it("names what is wrong in a typed error", () => {
    const bad = (value: unknown): ToolmeshError => {
      try {
        parseQuota(value);
      } catch (err) {
        return err as ToolmeshError;
      }
      throw new Error("accepted");
    };
    expect(bad({ max_in_flight: 0 })).toMatchObject({ code: "invalid_request" });
    expect(bad({ max_in_flight: 0 }).message).toMatch(/max_in_flight/);
    expect(bad({ rate: -1 }).message).toMatch(/rate/);
    expect(bad({ burst: 3 }).message).toMatch(/burst needs a rate/);
    expect(bad({ maxInFlight: 3 }).message).toMatch(/maxInFlight|unrecognized/i);
  });
});
