import { describe, expect, it } from "vitest";
import type { SchemaEvent, ToolSchema } from "@toolmesh/protocol";
import { SchemaInbox } from "./expansion.js";

const schema = (tool: string, revision: number, description = ""): ToolSchema => ({
  tool,
  revision,
  summary: "",
  description,
  parameters: { type: "object", properties: { a: { type: "string" } }, required: ["a"] },
  required: ["a"],
  groups: ["default"],
});
const event = (tool: string, revision: number, missing: string[]): SchemaEvent => ({
  ...schema(tool, revision, `About ${tool}.`),
  session_id: "s",
  reason: "missing_arguments",
  missing,
  at: 0,
});

describe("SchemaInbox", () => {
  it("hands each received schema to the next turn once, missing lists merged", () => {
    const inbox = new SchemaInbox();
    inbox.received(event("t", 1, ["a"]));
    inbox.received(event("t", 1, ["b"]));
    inbox.described([schema("u", 2)]);
    expect(inbox.hasPending("t")).toBe(true);
    expect(inbox.take()).toEqual([
      {
        tool: "t",
        parameters: schema("t", 1).parameters,
        missing: ["a", "b"],
        description: "About t.",
      },
      { tool: "u", parameters: schema("u", 2).parameters, missing: [] },
    ]);
    expect(inbox.take()).toEqual([]);
    expect([...inbox.latest().keys()]).toEqual(["t", "u"]);
  });

  it("keeps the newest revision and expands catalog entries with it", () => {
    const inbox = new SchemaInbox();
    inbox.received(event("t", 3, []));
    inbox.described([schema("t", 2)]);
    expect(inbox.latest().get("t")?.revision).toBe(3);
    const [t, other] = inbox.expand([
      { name: "t", summary: "one line" },
      { name: "other", summary: "x" },
    ]);
    expect(t).toEqual({
      name: "t",
      summary: "one line",
      parameters: schema("t", 3).parameters,
      description: "About t.",
    });
    expect(other).toEqual({ name: "other", summary: "x" });
  });

  it("wakes a waiter when the tool's schema arrives, and times out otherwise", async () => {
    const inbox = new SchemaInbox();
    const waiting = inbox.next("t", 5_000);
    inbox.received(event("other", 1, []));
    inbox.received(event("t", 1, ["a"]));
    expect((await waiting)?.tool).toBe("t");
    expect(await inbox.next("t", 1)).toBeUndefined();
    const closed = inbox.next("t", 5_000);
    inbox.close();
    expect(await closed).toBeUndefined();
  });
});
