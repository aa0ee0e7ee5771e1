import type { Command } from "commander";
import { InvalidArgumentError, Option } from "commander";
import type { Quota, QuotaScope } from "@toolmesh/protocol";
import { QuotaStore } from "@toolmesh/catalog";
import type { ScopedQuota } from "@toolmesh/catalog";
import type { RuntimeConfig } from "@toolmesh/runtime";
import { asOperator } from "./commands.js";
import { say } from "./print.js";

/** Options naming a quota's scope below a tenant. */
interface ScopeOptions {
  tool?: string;
  agent?: string;
  json?: boolean;
}

/** Limits given to `toolmesh quotas set`; `null` removes one (`--max-in-flight none`). */
type LimitOptions = { [K in keyof Quota]?: number | null };

const LIMIT_FLAGS: { flag: string; field: keyof Quota; what: string; integer: boolean }[] = [
  {
    flag: "max-in-flight",
    field: "max_in_flight",
    what: "calls accepted and not ended",
    integer: true,
  },
  {
    flag: "max-queued",
    field: "max_queued",
    what: "calls waiting for their fair turn at a busy tool",
    integer: true,
  },
  { flag: "rate", field: "rate", what: "calls per second (token bucket)", integer: false },
  {
    flag: "burst",
    field: "burst",
    what: "calls at once after a quiet spell (default: ceil(rate))",
    integer: true,
  },
  { flag: "daily", field: "daily", what: "calls per UTC day", integer: true },
  {
    flag: "weight",
    field: "weight",
    what: "share of a busy tool relative to other tenants (default 1)",
    integer: false,
  },
  {
    flag: "max-stored-bytes",
    field: "max_stored_bytes",
    what: "bytes of results the tenant's calls may have stored (default TOOLMESH_TENANT_MAX_STORED_BYTES)",
    integer: true,
  },
];

/** What `--flag none` parses to: commander stores an argument parser's `null` as `""`. */
const NONE = "none";

function limitValue(integer: boolean) {
  return (value: string): number | typeof NONE => {
    if (value === NONE) return NONE;
    const n = Number(value);
    if (!Number.isFinite(n) || n < 0 || (integer && !Number.isInteger(n)))
      throw new InvalidArgumentError(
        `must be ${integer ? "a whole number" : "a number"} of at least 0, or "none" to remove the limit`,
      );
    return n;
  };
}

function withQuotas(
  config: RuntimeConfig,
  json: boolean | undefined,
  fn: (store: QuotaStore) => Promise<number>,
): Promise<number> {
  return asOperator(config, json, async (nc, subjects) =>
    fn(await QuotaStore.open(nc, { subjects, replicas: config.streamReplicas })),
  );
}

function scopeOf(tenant: string, o: ScopeOptions): QuotaScope {
  return { tenant, tool: o.tool, agent: o.agent };
}

function describe(q: ScopedQuota): string {
  const where =
    q.scope.tool !== undefined
      ? `tenant ${q.scope.tenant} tool ${q.scope.tool}`
      : q.scope.agent !== undefined
        ? `tenant ${q.scope.tenant} agent ${q.scope.agent}`
        : `tenant ${q.scope.tenant}`;
  const limits = LIMIT_FLAGS.filter((l) => q.quota[l.field] !== undefined).map(
    (l) => `${l.flag}=${String(q.quota[l.field])}`,
  );
  return `${where}: ${limits.length === 0 ? "no limits" : limits.join(" ")}`;
}

/** `quotas set`: the limits given change, the others are kept. */
async function setQuota(
  store: QuotaStore,
  tenant: string,
  o: ScopeOptions & LimitOptions & Record<string, unknown>,
): Promise<number> {
  const limits: LimitOptions = {};
  for (const l of LIMIT_FLAGS) {
    const key = l.flag.replace(/-(\w)/g, (_, c: string) => c.toUpperCase());
    const value = o[key] as number | typeof NONE | undefined;
    if (value !== undefined) limits[l.field] = value === NONE ? null : value;
  }
  const stored = await store.set(scopeOf(tenant, o), limits);
  say(o.json === true ? JSON.stringify(stored) : describe(stored));
  return 0;
}

/** `quotas get`: a quota and what its scope uses now. */
async function getQuota(store: QuotaStore, tenant: string, o: ScopeOptions): Promise<number> {
  const scope = scopeOf(tenant, o);
  const found = await store.get(scope);
  if (found === undefined) {
    say(o.json === true ? "null" : "toolmesh: no quota for that scope");
    return 1;
  }
  const usage = await store.usage(scope);
  if (o.json === true) say(JSON.stringify({ ...found, usage }));
  else {
    say(describe(found));
    say(
      `  in flight ${usage.in_flight} (queued ${usage.queued}), today ${usage.today}` +
        (usage.tokens === undefined ? "" : `, tokens ${usage.tokens}`),
    );
  }
  return 0;
}

/** `toolmesh quotas set|get|list|rm`. */
export function addQuotaCommands(
  program: Command,
  config: () => RuntimeConfig,
  run: (command: () => Promise<number>) => void,
): void {
  const quotas = program
    .command("quotas")
    .description(
      "limit what a tenant (or one of its tools or agents) may run; every resolver applies changes at once",
    );
  const scoped = (cmd: Command): Command =>
    cmd
      .argument("<tenant>", "tenant id")
      .option("--tool <name>", "the quota of this tool of the tenant")
      .option("--agent <name>", "the quota of this agent of the tenant")
      .option("--json", "print JSON");

  const set = scoped(
    quotas.command("set").description('set limits (others are kept; "none" removes one)'),
  );
  for (const l of LIMIT_FLAGS)
    set.addOption(new Option(`--${l.flag} <n>`, l.what).argParser(limitValue(l.integer)));
  set.action((tenant: string, o: ScopeOptions & LimitOptions & Record<string, unknown>) =>
    run(() => withQuotas(config(), o.json, (store) => setQuota(store, tenant, o))),
  );

  scoped(quotas.command("get").description("print a quota and what its scope uses now")).action(
    (tenant: string, o: ScopeOptions) =>
      run(() => withQuotas(config(), o.json, (store) => getQuota(store, tenant, o))),
  );

  quotas
    .command("list")
    .description("list quotas, every tenant's or one's")
    .argument("[tenant]", "only this tenant's quotas")
    .option("--json", "print JSON")
    .action((tenant: string | undefined, o: { json?: boolean }) =>
      run(() =>
        withQuotas(config(), o.json, async (store) => {
          const all = await store.list(tenant);
          if (o.json === true) say(JSON.stringify(all));
          else if (all.length === 0) say("no quotas");
          else for (const q of all) say(describe(q));
          return 0;
        }),
      ),
    );

  scoped(
    quotas.command("rm").description("remove a quota (the scope is no longer limited)"),
  ).action((tenant: string, o: ScopeOptions) =>
    run(() =>
      withQuotas(config(), o.json, async (store) => {
        const removed = await store.remove(scopeOf(tenant, o));
        say(
          o.json === true
            ? JSON.stringify({ removed })
            : removed
              ? "removed"
              : "toolmesh: no quota for that scope",
        );
        return removed ? 0 : 1;
      }),
    ),
  );
}
