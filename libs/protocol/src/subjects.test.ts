import { describe, expect, it } from "vitest";
import { Defaults } from "./defaults.js";
import { ErrorCode, ToolmeshError } from "./errors.js";
import {
  MAX_TOKEN_LENGTH,
  PROTOCOL_VERSION,
  assertValidPrefix,
  createSubjects,
  subjectToken,
} from "./subjects.js";

const TOKEN = /^[A-Za-z0-9_=-]+$/;
const HASHED = /^[A-Za-z0-9_=-]{38}==[0-9a-f]{24}$/;

/** `=xx` per UTF-8 byte, the documented escape. */
function escaped(text: string): string {
  return [...Buffer.from(text, "utf8")].map((b) => `=${b.toString(16).padStart(2, "0")}`).join("");
}

/** Deterministic PRNG (mulberry32) so a failure can be replayed. */
function prng(seed: number): () => number {
  let a = seed;
  return () => {
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function expectInvalidRequest(fn: () => unknown): void {
  let thrown: unknown;
  try {
    fn();
  } catch (err) {
    thrown = err;
  }
  expect(thrown).toBeInstanceOf(ToolmeshError);
  expect((thrown as ToolmeshError).code).toBe(ErrorCode.InvalidRequest);
}

const LONG_PREFIX = "p".repeat(100);

/** Names chosen to collide under a careless mapping. */
const TRICKY_NAMES: readonly string[] = [
  "a.b",
  "a=2eb",
  "a=2Eb",
  "a_b",
  "a-b",
  "a b",
  "a  b",
  "a\tb",
  "a*b",
  "a>b",
  "a=b",
  "a==b",
  "a=3db",
  "A.b",
  "a.B",
  "ab",
  ".",
  "..",
  "=",
  "==",
  "=2e",
  "=3d",
  "*",
  ">",
  " ",
  "\u0000",
  "\u007f",
  "é",
  "e\u0301",
  "=c3=a9",
  "中文",
  "😀",
  "👍🏽",
  "x".repeat(MAX_TOKEN_LENGTH),
  "x".repeat(MAX_TOKEN_LENGTH + 1),
  "x".repeat(MAX_TOKEN_LENGTH + 2),
  ".".repeat(21),
  ".".repeat(21) + "a",
  ".".repeat(21) + "ab",
  ".".repeat(22),
  `${LONG_PREFIX}a`,
  `${LONG_PREFIX}b`,
  `${LONG_PREFIX}.`,
  `${LONG_PREFIX}=2e`,
  `${LONG_PREFIX}`,
  `${"a.".repeat(50)}`,
  `${"a.".repeat(50)}x`,
  // A name that spells out what another long name hashes to must still map elsewhere.
  subjectToken("y".repeat(200)),
  "y".repeat(200),
];

describe("subjectToken", () => {
  it("keeps safe names as they are", () => {
    for (const name of [
      "get_weather",
      "A-Z_0-9",
      "x",
      "0",
      "-",
      "_",
      "x".repeat(MAX_TOKEN_LENGTH),
    ]) {
      expect(subjectToken(name)).toBe(name);
    }
  });

  it.each([
    [".", "=2e"],
    ["*", "=2a"],
    [">", "=3e"],
    [" ", "=20"],
    ["\t", "=09"],
    ["\n", "=0a"],
    ["\r", "=0d"],
    ["\u0000", "=00"],
    ["\u001b", "=1b"],
    ["\u007f", "=7f"],
    ["=", "=3d"],
    ["/", "=2f"],
    ["é", "=c3=a9"],
    ["中文", "=e4=b8=ad=e6=96=87"],
    ["😀", "=f0=9f=98=80"],
  ])("escapes %j as %s", (name, token) => {
    expect(subjectToken(name)).toBe(token);
  });

  it("escapes only the unsafe bytes of a mixed name, in lower-case hex", () => {
    expect(subjectToken("fs.read file")).toBe("fs=2eread=20file");
    expect(subjectToken("café.au-lait_1")).toBe("caf=c3=a9=2eau-lait_1");
    expect(subjectToken("a>b*c")).toBe("a=3eb=2ac");
    expect(subjectToken("ÿ")).toBe(escaped("ÿ"));
    expect(subjectToken("ÿ")).not.toMatch(/[A-F]/);
  });

  it("rejects an empty name with invalid_request", () => {
    expectInvalidRequest(() => subjectToken(""));
  });

  it("keeps an escaped name of exactly the limit and hashes one a byte over", () => {
    const at = ".".repeat(21) + "a"; // 21 * 3 + 1 = 64
    expect(subjectToken(at)).toBe(`${"=2e".repeat(21)}a`);
    expect(subjectToken(at)).toHaveLength(MAX_TOKEN_LENGTH);
    const over = ".".repeat(21) + "ab"; // 65
    expect(subjectToken(over)).toMatch(HASHED);
  });

  it("hashes safe names longer than the limit", () => {
    const token = subjectToken("x".repeat(MAX_TOKEN_LENGTH + 1));
    expect(token).toMatch(HASHED);
    expect(token.startsWith("x".repeat(38))).toBe(true);
    expect(token).toHaveLength(MAX_TOKEN_LENGTH);
  });

  it("hashes a 64-character name whose escaped form is too long", () => {
    const name = "a.".repeat(32);
    expect(name).toHaveLength(MAX_TOKEN_LENGTH);
    const token = subjectToken(name);
    expect(token).toMatch(HASHED);
    expect(token.length).toBeLessThanOrEqual(MAX_TOKEN_LENGTH);
  });

  it("maps a 4 KB name to a bounded token, the same every time", () => {
    const name = "é.*>".repeat(1024);
    expect(Buffer.byteLength(name)).toBeGreaterThan(4096);
    const token = subjectToken(name);
    expect(token).toMatch(HASHED);
    expect(token).toMatch(TOKEN);
    expect(subjectToken(name)).toBe(token);
  });

  it("gives names sharing a 100-character prefix distinct tokens", () => {
    const a = subjectToken(`${LONG_PREFIX}a`);
    const b = subjectToken(`${LONG_PREFIX}b`);
    expect(a).not.toBe(b);
    expect(a.slice(0, 38)).toBe(b.slice(0, 38));
  });

  it("always gives a valid, bounded token", () => {
    const random = prng(7);
    const alphabet = [
      "a",
      "Z",
      "9",
      "_",
      "-",
      ".",
      "*",
      ">",
      " ",
      "\t",
      "\n",
      "=",
      "é",
      "中",
      "😀",
      "\u0000",
    ];
    const names = [...TRICKY_NAMES];
    for (let i = 0; i < 2_000; i++) {
      const length = 1 + Math.floor(random() * 90);
      let name = "";
      for (let j = 0; j < length; j++) name += alphabet[Math.floor(random() * alphabet.length)];
      names.push(name);
    }
    for (const name of names) {
      const token = subjectToken(name);
      expect(token, JSON.stringify(name)).toMatch(TOKEN);
      expect(token.length, JSON.stringify(name)).toBeLessThanOrEqual(MAX_TOKEN_LENGTH);
    }
  });

  it("maps distinct names to distinct tokens (tricky and generated names)", () => {
    const random = prng(42);
    // Small alphabets make near-collisions ("a.b" vs "a=2eb") likely.
    const alphabet = ["a", "b", "2", "e", "E", "=", ".", "_", "-", " ", "é", "😀"];
    const names = new Set(TRICKY_NAMES);
    for (let i = 0; i < 5_000; i++) {
      const length = 1 + Math.floor(random() * (random() < 0.2 ? 80 : 8));
      let name = "";
      for (let j = 0; j < length; j++) name += alphabet[Math.floor(random() * alphabet.length)];
      names.add(name);
    }
    const byToken = new Map<string, string>();
    for (const name of names) {
      const token = subjectToken(name);
      const other = byToken.get(token);
      expect(other, `${JSON.stringify(name)} and ${JSON.stringify(other)} share ${token}`).toBe(
        undefined,
      );
      byToken.set(token, name);
    }
    expect(byToken.size).toBe(names.size);
  });

  it("maps names holding lone UTF-16 surrogates to distinct tokens", () => {
    // JSON allows "\ud800"; a name like this can arrive from a model or an MCP server.
    const names = ["\ud800", "\udc00", "\ufffd", "x\ud83dy", "x\ufffdy"];
    const tokens = names.map((n) => subjectToken(n));
    expect(new Set(tokens).size, JSON.stringify(tokens)).toBe(names.length);
    const long = ["\ud800".repeat(100), "\ufffd".repeat(100)].map((n) => subjectToken(n));
    expect(long[0]).not.toBe(long[1]);
  });
});

describe("createSubjects", () => {
  const nastyIds: readonly string[] = [
    "a.b",
    "*",
    ">",
    "a..b",
    ".",
    " ",
    "s 1\t2",
    "x.*.>",
    "é中😀",
    "=",
    "\u0000",
    "z".repeat(4096),
    ".".repeat(2000),
  ];

  it("uses the default prefix", () => {
    const s = createSubjects();
    expect(s.prefix).toBe(Defaults.prefix);
    expect(s.work("get_weather")).toBe(`toolmesh.${PROTOCOL_VERSION}.work.get_weather`);
    expect(s.call(s.address("default", "s1"))).toBe("toolmesh.v1.calls.default.s1");
    expect(s.streams.calls).toBe("TOOLMESH_CALLS");
    expect(s.registryBucket).toBe("toolmesh_tools");
  });

  it("uses a custom dotted prefix in every subject", () => {
    const s = createSubjects({ prefix: "acme.prod-1" });
    const at = s.address("t", "s");
    expect(s.call(at)).toBe("acme.prod-1.v1.calls.t.s");
    expect(s.cancel(at)).toBe("acme.prod-1.v1.cancel.t.s");
    expect(s.work("x")).toBe("acme.prod-1.v1.work.x");
    expect(s.sessionEvents(at)).toBe("acme.prod-1.v1.sessions.t.s.>");
    expect(s.result(at, "c")).toBe("acme.prod-1.v1.sessions.t.s.result.c");
    expect(s.progress(at, "c")).toBe("acme.prod-1.v1.sessions.t.s.progress.c");
    expect(s.schema(at, "x")).toBe("acme.prod-1.v1.sessions.t.s.schema.x");
    expect(s.missingArguments(at, "x")).toBe("acme.prod-1.v1.events.missing.t.x");
    expect(s.resolveRpc("t")).toBe("acme.prod-1.v1.rpc.t.resolve");
    expect(s.allCalls).toBe("acme.prod-1.v1.calls.*.*");
    expect(s.allWork).toBe("acme.prod-1.v1.work.*");
    expect(s.allEvents).toBe("acme.prod-1.v1.events.>");
    expect(s.allResolveRpc).toBe("acme.prod-1.v1.rpc.*.resolve");
    for (const subject of [
      s.allCalls,
      s.allWork,
      s.allEvents,
      s.allResolveRpc,
      ...s.storedSessionEvents,
    ]) {
      expect(subject.startsWith("acme.prod-1.v1.")).toBe(true);
    }
  });

  // Upper case and `_` are refused too: `a.b`/`a_b` and `Prod`/`prod` would share streams.
  it.each([
    "",
    "a..b",
    "a b",
    "*",
    ">",
    ".a",
    "a.",
    "a.*",
    "a.>",
    "a\tb",
    "é",
    "a/b",
    ".",
    "a_b",
    "Prod",
  ])("rejects the prefix %j", (prefix) => {
    expectInvalidRequest(() => createSubjects({ prefix }));
    expectInvalidRequest(() => assertValidPrefix(prefix));
  });

  it("accepts prefixes of safe parts", () => {
    for (const prefix of ["a", "a.b", "a-b-1.c.d"]) {
      expect(() => createSubjects({ prefix })).not.toThrow();
    }
  });

  it("never lets an id add a token, an empty token or a wildcard", () => {
    for (const prefix of [Defaults.prefix, "acme.prod"]) {
      const s = createSubjects({ prefix });
      const baseTokens = prefix.split(".").length + 1;
      for (const id of nastyIds) {
        const at = s.address(id, id);
        const concrete: [string, number][] = [
          [s.call(at), baseTokens + 3],
          [s.cancel(at), baseTokens + 3],
          [s.work(id), baseTokens + 2],
          [s.result(at, id), baseTokens + 5],
          [s.progress(at, id), baseTokens + 5],
          [s.schema(at, id), baseTokens + 5],
          [s.missingArguments(at, id), baseTokens + 4],
          [s.resolveRpc(id), baseTokens + 3],
          [s.dlq(id), baseTokens + 2],
        ];
        for (const [subject, tokens] of concrete) {
          const parts = subject.split(".");
          expect(parts, `${subject} from ${JSON.stringify(id.slice(0, 20))}`).toHaveLength(tokens);
          for (const part of parts) {
            expect(part, subject).toMatch(TOKEN);
          }
          expect(subject.length).toBeLessThan(512);
        }
        // The one intended wildcard of sessionEvents is its last token.
        const events = s.sessionEvents(at).split(".");
        expect(events.pop()).toBe(">");
        expect(events).toHaveLength(baseTokens + 3);
        for (const part of events) expect(part).toMatch(TOKEN);
        expect(s.workConsumer(id)).toMatch(/^[A-Za-z0-9_=-]+$/);
      }
    }
  });

  it("maps different ids to different subjects", () => {
    const s = createSubjects();
    const subjects = new Set(nastyIds.map((id) => s.work(id)));
    expect(subjects.size).toBe(nastyIds.length);
    expect(s.work("a.b")).not.toBe(s.work("a_b"));
    expect(s.call(s.address("a.b", "c"))).not.toBe(s.call(s.address("a", "b.c")));
  });

  it("reads the session address back from call and cancel subjects", () => {
    for (const prefix of [Defaults.prefix, "acme.prod.eu"]) {
      const s = createSubjects({ prefix });
      for (const tenant of ["default", "t.1", "*"]) {
        for (const session of nastyIds) {
          const at = s.address(tenant, session);
          expect(s.parseSessionSubject(s.call(at))).toEqual(at);
          expect(s.parseSessionSubject(s.cancel(at))).toEqual(at);
        }
      }
    }
  });

  it("reads the address and call back from a result subject", () => {
    for (const prefix of [Defaults.prefix, "acme.prod.eu"]) {
      const s = createSubjects({ prefix });
      for (const id of nastyIds) {
        const at = s.address("t.1", id);
        expect(s.parseResultSubject(s.result(at, id))).toEqual({
          address: at,
          call: subjectToken(id),
        });
      }
      const at = s.address("t", "s");
      expect(s.parseResultSubject(s.progress(at, "c"))).toBeUndefined();
      expect(s.parseResultSubject(s.call(at))).toBeUndefined();
    }
  });

  it("reads no session address from subjects of another shape", () => {
    const s = createSubjects({ prefix: "acme.prod" });
    const at = s.address("t", "s");
    expect(s.parseSessionSubject(s.result(at, "c"))).toBeUndefined();
    expect(s.parseSessionSubject(s.work("x"))).toBeUndefined();
    expect(s.parseSessionSubject("acme.prod.v1.calls.t")).toBeUndefined();
    expect(s.parseSessionSubject("")).toBeUndefined();
  });

  it("reads the tenant back from a resolve subject", () => {
    for (const prefix of [Defaults.prefix, "a.b.c"]) {
      const s = createSubjects({ prefix });
      for (const tenant of ["default", "t.1", "é", "x".repeat(300)]) {
        expect(s.parseRpcTenant(s.resolveRpc(tenant))).toBe(subjectToken(tenant));
      }
      expect(s.parseRpcTenant(prefix)).toBeUndefined();
    }
  });

  it("reads the kind and the session back from session event subjects", () => {
    for (const prefix of [Defaults.prefix, "a.b.c"]) {
      const s = createSubjects({ prefix });
      const at = s.address("t.x", "s.y");
      expect(s.sessionEventKind(s.result(at, "c.1"))).toBe("result");
      expect(s.sessionEventKind(s.progress(at, "c.1"))).toBe("progress");
      expect(s.sessionEventKind(s.schema(at, "tool.name"))).toBe("schema");
      expect(s.sessionEventKind(s.call(at))).toBeUndefined();
      expect(s.sessionOfEvent(s.result(at, "c.1"))).toBe(at.session);
      expect(s.sessionOfEvent(s.rejected(at, 7))).toBe(at.session);
      expect(s.sessionOfEvent(s.schema(at, "tool.name"))).toBe(at.session);
    }
  });

  it("gives valid stream, bucket and consumer names for a dotted prefix", () => {
    const s = createSubjects({ prefix: "acme.prod-1.eu-west" });
    const streams = Object.values(s.streams);
    expect(streams.length).toBeGreaterThanOrEqual(4);
    expect(new Set(streams).size).toBe(streams.length);
    for (const name of streams) {
      expect(name).toMatch(/^[^.*> \t\r\n]+$/);
      expect(name.length).toBeLessThanOrEqual(255);
    }
    expect(s.registryBucket).toMatch(/^[a-zA-Z0-9_-]+$/);
    expect(s.callsBucket).toMatch(/^[a-zA-Z0-9_-]+$/);
    expect(s.callsBucket).not.toBe(s.registryBucket);
    expect(s.resolverConsumer).toMatch(/^[^.*> \t\r\n]+$/);
    expect(s.workConsumer("a.b*c>d e")).toMatch(/^[^.*> \t\r\n]+$/);
  });
});

describe("schema expansion names", () => {
  it("builds the request-reply subjects, buckets, keys and consumer of the schema expander", () => {
    const s = createSubjects({ prefix: "acme.prod-1" });
    expect(s.catalogRpc("t.1")).toBe("acme.prod-1.v1.rpc.t=2e1.catalog");
    expect(s.describeRpc("t")).toBe("acme.prod-1.v1.rpc.t.describe");
    expect(s.expandRpc("t")).toBe("acme.prod-1.v1.rpc.t.expand");
    expect(s.groupsRpc("t")).toBe("acme.prod-1.v1.rpc.t.groups");
    expect([s.allCatalogRpc, s.allDescribeRpc, s.allExpandRpc, s.allGroupsRpc]).toEqual([
      "acme.prod-1.v1.rpc.*.catalog",
      "acme.prod-1.v1.rpc.*.describe",
      "acme.prod-1.v1.rpc.*.expand",
      "acme.prod-1.v1.rpc.*.groups",
    ]);
    expect(s.parseRpcTenant(s.groupsRpc("t.1"))).toBe("t=2e1");
    expect(s.allMissingArguments).toBe("acme.prod-1.v1.events.missing.>");
    expect(s.sessionsBucket).toBe("acme_prod-1_sessions");
    expect(s.groupsBucket).toBe("acme_prod-1_groups");
    expect(s.toolApprovalsBucket).toBe("acme_prod-1_tool_approvals");
    expect(s.sessionStateKey(s.address("t.1", "s 2"), "policy")).toBe("t=2e1.s=202.policy");
    expect(s.allSessionPolicies).toBe("*.*.policy");
    expect(s.schemaExpanderConsumer).toMatch(/^[^.*> \t\r\n]+$/);
    for (const bucket of [s.sessionsBucket, s.groupsBucket]) {
      expect(bucket).toMatch(/^[a-zA-Z0-9_-]+$/);
      expect([s.registryBucket, s.callsBucket]).not.toContain(bucket);
    }
  });
});

describe("registry keys and inbox prefixes", () => {
  const s = createSubjects({ prefix: "acme.prod" });

  it("puts a tool's namespace in its own token, and keeps names without one as their token", () => {
    expect(s.registryKey("echo")).toBe("echo");
    expect(s.registryKey("github.create_issue")).toBe("github.create_issue");
    expect(s.registryKey("a.b.c")).toBe("a.b=2ec");
    expect(s.registryKey(".hidden")).toBe(subjectToken(".hidden"));
    expect(s.registryKey("trailing.")).toBe(subjectToken("trailing."));
    expect(s.registryKey("my tool.x*")).toBe("my=20tool.x=2a");
  });

  it("gives distinct names distinct keys", () => {
    const names = ["a.b", "a=2eb", "a.b.c", "a.b=2ec", "a", "a.", ".a", "a..b"];
    const keys = names.map((n) => s.registryKey(n));
    expect(new Set(keys).size).toBe(names.length);
  });

  it("builds an inbox prefix per role and per frontend identity", () => {
    expect(s.inboxPrefix("resolver")).toBe("_INBOX.acme.prod.resolver");
    expect(s.frontendInboxPrefix("tenant a")).toBe("_INBOX.acme.prod.frontend.tenant=20a");
    expect(s.frontendInboxPrefix("t", "s.1")).toBe("_INBOX.acme.prod.frontend.t.s=2e1");
  });
});
