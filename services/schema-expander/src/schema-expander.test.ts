import { describe, expect, it } from "vitest";
import type { Msg } from "@nats-io/nats-core";
import { createSubjects, decodeJson } from "@toolmesh/protocol";
import { createLogger } from "@toolmesh/telemetry";
import type { ExpanderDeps } from "./schema-expander.js";
import { answer, answerGroups } from "./schema-expander.js";

// The request handlers are plain functions of their dependencies: the paths that end before any
// NATS or KV access are checked here, the rest in test/schema-expansion.test.ts.
const subjects = createSubjects({ prefix: "ux" });
const deps = {
  subjects,
  log: createLogger({ service: "test", level: "silent" }),
} as unknown as ExpanderDeps;

/** A request as the subscription hands it over; `replies` collects what it answers. */
function request(subject: string, body: string): { msg: Msg; replies: unknown[] } {
  const replies: unknown[] = [];
  const msg = {
    subject,
    reply: "_INBOX.test",
    data: new TextEncoder().encode(body),
    respond: (data: Uint8Array) => replies.push(decodeJson(data)) > 0,
  } as unknown as Msg;
  return { msg, replies };
}

describe("answerGroups", () => {
  it("refuses a group named twice in one request, before touching any state", async () => {
    await expect(
      answerGroups(deps, "default", { enable: ["web"], disable: ["web"] }),
    ).rejects.toMatchObject({ code: "invalid_request" });
  });
});

describe("answer", () => {
  it("answers a body that is not JSON with invalid_request", async () => {
    const { msg, replies } = request(subjects.groupsRpc("default"), "{not json");
    await answer(deps, msg, answerGroups);
    expect(replies).toMatchObject([{ ok: false, error: { code: "invalid_request" } }]);
  });

  it("passes the tenant of the subject and the decoded body to the handler", async () => {
    const { msg, replies } = request(subjects.groupsRpc("acme"), '{"x":1}');
    await answer(deps, msg, async (_deps, tenant, body) => ({ ok: true, tenant, body }));
    expect(replies).toEqual([{ ok: true, tenant: "acme", body: { x: 1 } }]);
  });
});
