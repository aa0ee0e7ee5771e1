import { describe, expect, it } from "vitest";
import type { ToolDefinition } from "@toolmesh/protocol";
import { CompiledPolicySet } from "./policy-set.js";
import { PolicyDecider } from "./decider.js";

// Property: over random policy sets and tools, a catalog never hides a tool a call is allowed
// for, and, when no policy reads the arguments, shows a tool exactly when its calls are
// allowed. Policies that read arguments are decided with the arguments unknown (Cedar's
// partial evaluation): a tool stays listed while some policy could still permit it.

function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s * 1664525 + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

const KINDS = ["native", "mcp"] as const;
const GROUPS = ["default", "fs", "net"];
const AGENTS = ["reader", "writer", undefined];
const PATHS = ["/tmp/a", "/etc/passwd", "/home/x"];

function pick<T>(r: () => number, items: readonly T[]): T {
  return items[Math.floor(r() * items.length)]!;
}

function condition(r: () => number, readsArgs: boolean): string {
  switch (pick(r, readsArgs ? [0, 1, 2, 3, 4, 5, 6] : [0, 1, 2, 3, 5])) {
    case 0:
      return `resource.kind == "${pick(r, ["native", "mcp", "http"])}"`;
    case 1:
      return `resource.groups.contains("${pick(r, GROUPS)}")`;
    case 2:
      return `resource.annotations has readOnlyHint && resource.annotations.readOnlyHint`;
    case 3:
      return `context has agent && context.agent == "${pick(r, ["reader", "writer"])}"`;
    case 4:
      return `context.args has path && context.args.path like "${pick(r, ["/tmp/*", "/etc/*"])}"`;
    case 5:
      return `principal == Toolmesh::Tenant::"${pick(r, ["acme", "globex"])}"`;
    default:
      return `context.args has n && context.args.n > ${Math.floor(r() * 10)}`;
  }
}

function randomSet(r: () => number, readsArgs: boolean): string {
  const count = 1 + Math.floor(r() * 5);
  const policies: string[] = [];
  for (let i = 0; i < count; i++) {
    const effect = r() < 0.7 ? "permit" : "forbid";
    const when =
      r() < 0.2
        ? ""
        : ` when { ${condition(r, readsArgs)}${r() < 0.3 ? ` && ${condition(r, readsArgs)}` : ""} }`;
    policies.push(`@id("p${i}") ${effect}(principal, action, resource)${when};`);
  }
  return policies.join("\n");
}

function randomTool(r: () => number, i: number): ToolDefinition {
  return {
    name: `tool${i}`,
    description: "",
    summary: "",
    parameters: { type: "object" },
    groups: [pick(r, GROUPS)],
    system_params: [],
    preset_params: [],
    kind: pick(r, KINDS),
    progress: false,
    owner: "svc",
    timeout_ms: 1_000,
    retry: {
      max_attempts: 1,
      initial_backoff_ms: 1,
      backoff_multiplier: 1,
      max_backoff_ms: 1,
      non_retryable_codes: [],
    },
    ...(r() < 0.5 ? { annotations: { readOnlyHint: r() < 0.5 } } : {}),
  };
}

// Every argument shape the random conditions can tell apart.
const ARGS: Record<string, unknown>[] = [{}];
for (const path of PATHS)
  for (const n of [undefined, 0, 5, 9, 10]) ARGS.push({ path, ...(n === undefined ? {} : { n }) });
for (const n of [0, 5, 9, 10]) ARGS.push({ n });

describe("catalog and calls", () => {
  it("never disagree over random policy sets and tools", () => {
    const r = rng(31);
    let shown = 0;
    let hidden = 0;
    for (let round = 0; round < 120; round++) {
      const readsArgs = round % 2 === 1;
      const decider = new PolicyDecider();
      decider.setOperator({ set: CompiledPolicySet.compile(randomSet(r, readsArgs)), revision: 1 });
      if (r() < 0.4)
        decider.setTenant("acme", {
          set: CompiledPolicySet.compile(randomSet(r, readsArgs)),
          revision: 2,
        });
      const tool = randomTool(r, round);
      for (const tenant of ["acme", "globex"]) {
        for (const agent of AGENTS) {
          const listed = decider.mayList({ tenant, tool, agent, session: "s" });
          const callable = ARGS.some(
            (args) =>
              decider.decide("call", { tenant, tool, agent, session: "s", args })?.allowed === true,
          );
          const seen = { round, tenant, agent, readsArgs };
          // Never hidden while callable; exactly as callable when no policy reads arguments.
          if (callable || !readsArgs)
            expect({ ...seen, listed }).toEqual({ ...seen, listed: callable });
          if (listed) shown++;
          else hidden++;
        }
      }
    }
    // Both sides of the property were exercised.
    expect(shown).toBeGreaterThan(50);
    expect(hidden).toBeGreaterThan(50);
  }, 120_000);
});
