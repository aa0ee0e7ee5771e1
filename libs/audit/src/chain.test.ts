import canonicalizeModule from "canonicalize";
import { describe, expect, it } from "vitest";
import { ChainVerifier, recordHash, sealForStore } from "./chain.js";
import type { AuditRecord } from "./events.js";

const canonicalize = canonicalizeModule as unknown as (input: unknown) => string | undefined;

function chain(n: number): AuditRecord[] {
  const out: AuditRecord[] = [];
  let tail = { seq: 0, hash: null as string | null };
  for (let i = 0; i < n; i++) {
    const { record, data } = sealForStore(
      {
        v: 1,
        id: `e${i}`,
        tenant: "acme",
        type: "call.ended",
        call_id: `c${i}`,
        at: 1_700_000_000_000 + i,
        by: "test",
        data: { outcome: "ok" },
      },
      tail,
    );
    // What is stored is the record, whatever its key order.
    expect(JSON.parse(data)).toEqual(record);
    out.push(JSON.parse(data) as AuditRecord);
    tail = { seq: record.seq, hash: record.hash };
  }
  return out;
}

function verify(records: unknown[], tenant = "acme") {
  const v = new ChainVerifier(tenant);
  for (const [i, r] of records.entries()) {
    const broken = v.check(i + 1, r);
    if (broken !== undefined) return broken;
  }
  return v.count;
}

describe("ChainVerifier", () => {
  it("passes an intact chain", () => {
    expect(verify(chain(5))).toBe(5);
  });

  it("finds a rewritten event by its own hash", () => {
    const records = chain(5);
    (records[2] as AuditRecord).data = { outcome: "tool_error" };
    expect(verify(records)).toEqual({ seq: 3, reason: expect.stringMatching(/rewritten/) });
  });

  it("finds a rewritten event whose hash was recomputed by the next link", () => {
    const records = chain(5);
    const forged = { ...(records[2] as AuditRecord), data: { outcome: "tool_error" } };
    forged.hash = recordHash(forged);
    records[2] = forged;
    expect(verify(records)).toEqual({ seq: 4, reason: expect.stringMatching(/previous hash/) });
  });

  it("finds an event of another tenant and a removed one", () => {
    expect(verify(chain(3), "globex")).toMatchObject({ seq: 1 });
    const v = new ChainVerifier("acme");
    const [a, , c] = chain(3);
    expect(v.check(1, a)).toBeUndefined();
    expect(v.check(3, c)).toEqual({ seq: 3, reason: "event 2 is missing" });
  });
});

describe("sealForStore", () => {
  const event = {
    v: 1 as const,
    id: "e1",
    tenant: "acme",
    type: "call.admitted" as const,
    at: 1_700_000_000_123,
    by: "resolver@host/1",
    data: {},
  };
  const cases: [string, Omit<AuditRecord, "hash" | "seq" | "prev">][] = [
    ["no optional fields", event],
    ["every field", { ...event, call_id: "c1", session: "s1", tool: "echo" }],
    [
      "data that needs sorting, nesting, odd numbers and text",
      {
        ...event,
        tool: 'ünï\u2028"q"\\',
        data: {
          zeta: [3, { b: null, a: -0 }, "\u{1F600}"],
          alpha: { y: 1e21, x: 0.1 + 0.2, "\u00e9": true, E: "\n" },
          skipped: undefined,
        },
      },
    ],
    ["a field of no known name", { ...event, extra: { b: 1, a: 2 } } as typeof event],
  ];

  it.each(cases)("stores the canonical JSON of the record and hashes it: %s", (_name, input) => {
    const { record, data } = sealForStore(input, { seq: 41, hash: "f".repeat(64) });
    const { hash, ...rest } = record;
    expect(data).toBe(`${canonicalize(rest)?.slice(0, -1)},"hash":"${hash}"}`);
    expect(hash).toBe(recordHash(record));
  });
});
