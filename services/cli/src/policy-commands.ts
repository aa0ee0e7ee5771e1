import { readFile } from "node:fs/promises";
import type { Command } from "commander";
import { InvalidArgumentError } from "commander";
import { Kvm } from "@nats-io/kv";
import type { Subjects } from "@toolmesh/protocol";
import {
  CallRecordSchema,
  ErrorCode,
  ToolmeshError,
  decodeJsonOrUndefined,
  parseDurationMs,
  subjectToken,
} from "@toolmesh/protocol";
import type { NatsConnection } from "@nats-io/nats-core";
import type { PolicyDecision } from "@toolmesh/policy";
import {
  CompiledPolicySet,
  PolicyDecider,
  PolicySetError,
  PolicyStore,
  openPolicyBucket,
} from "@toolmesh/policy";
import type { RuntimeConfig } from "@toolmesh/runtime";
import { asOperator, openForReading } from "./commands.js";
import { say } from "./print.js";

interface ScopeOptions {
  tenant?: string;
  json?: boolean;
}

/** `30m`, `2h`, `7d`… in ms (a commander argument parser). */
export function durationMs(value: string): number {
  const ms = parseDurationMs(value);
  if (ms === undefined)
    throw new InvalidArgumentError("must be a duration such as 90s, 30m, 2h or 7d");
  return ms;
}

function withPolicies(
  config: RuntimeConfig,
  json: boolean | undefined,
  fn: (store: PolicyStore, nc: NatsConnection, subjects: Subjects) => Promise<number>,
): Promise<number> {
  return asOperator(config, json, async (nc, subjects) =>
    fn(
      new PolicyStore(await openPolicyBucket(nc, { subjects, replicas: config.streamReplicas })),
      nc,
      subjects,
    ),
  );
}

async function readPolicyFile(file: string): Promise<string> {
  try {
    return await readFile(file, "utf8");
  } catch (err) {
    throw new ToolmeshError(
      ErrorCode.InvalidRequest,
      `cannot read ${file}: ${(err as Error).message}`,
    );
  }
}

function whose(tenant: string | undefined): string {
  return tenant === undefined ? "the operator's policy set" : `tenant ${tenant}'s policy set`;
}

/** The decider holding the sets stored now, `candidate` in place of the one of `tenant`. */
async function deciders(
  store: PolicyStore,
  tenant: string | undefined,
  candidate?: CompiledPolicySet,
): Promise<{ current: PolicyDecider; next: PolicyDecider }> {
  const current = new PolicyDecider();
  const next = new PolicyDecider();
  const operator = await store.get();
  const own = tenant === undefined ? undefined : await store.get(tenant);
  const scope = (stored: { text: string; revision: number } | undefined) =>
    stored === undefined
      ? undefined
      : { set: CompiledPolicySet.compile(stored.text), revision: stored.revision };
  for (const d of [current, next]) {
    d.setOperator(scope(operator));
    if (tenant !== undefined) d.setTenant(subjectToken(tenant), scope(own));
  }
  if (candidate !== undefined) {
    const replaced = { set: candidate, revision: 0 };
    if (tenant === undefined) next.setOperator(replaced);
    else next.setTenant(subjectToken(tenant), replaced);
  }
  return { current, next };
}

function effectOf(described: string): string {
  return described.split(" ")[0] ?? described;
}

function describeDecision(d: PolicyDecision | "depends" | undefined): string {
  if (d === undefined) return "allow (no policy set)";
  if (d === "depends") return "depends on the arguments";
  const by = d.policies.length === 0 ? "no policy permits" : d.policies.join(", ");
  // Allowed once a person approves: the operator (`toolmesh approvals`), or the caller.
  const effect = !d.allowed
    ? "deny"
    : d.approval === undefined
      ? "allow"
      : `approval by the ${d.approval.mode}`;
  return `${effect} (${by}; ${d.version})`;
}

/** `toolmesh policy set|get|rm|check|replay`. */
export function addPolicyCommands(
  program: Command,
  config: () => RuntimeConfig,
  run: (command: () => Promise<number>) => void,
): void {
  // `--tenant` is the program's own option (given before or after the subcommand): whose set.
  const tenantFlag = (): string | undefined => program.opts<{ tenant?: string }>().tenant;
  /** Runs a subcommand with the policies bucket, its options completed with `--tenant`. */
  const scoped: Scoped =
    <O extends { json?: boolean }>(fn: ScopedCommand<O>) =>
    (given: O): void =>
      run(() => {
        const o = { ...given, tenant: tenantFlag() };
        return withPolicies(config(), o.json, (store, nc, subjects) => fn(o, store, nc, subjects));
      });
  const policy = program
    .command("policy")
    .description("decide who may call and list which tools with Cedar policies (docs/policy.md)");

  policy
    .command("set")
    .description("validate a Cedar policy file and put it in force (a bad file changes nothing)")
    .argument("<file>", "the Cedar policy set (with --tenant T: tenant T's, not the operator's)")
    .option("--json", "print JSON")
    .action((file: string, given: ScopeOptions) =>
      scoped<ScopeOptions>((o, store) => setPolicy(store, file, o))(given),
    );

  policy
    .command("get")
    .description("print the policy set in force")
    .option("--json", "print JSON")
    .action(scoped<ScopeOptions>((o, store) => getPolicy(store, o)));

  policy
    .command("rm")
    .description("remove a policy set (its history stays in the bucket)")
    .option("--operator", "the operator's set: with none left, every tool is open again")
    .option("--json", "print JSON")
    .action(scoped<ScopeOptions & { operator?: boolean }>((o, store) => removePolicy(store, o)));

  addPolicyEvaluation(policy, config, run, tenantFlag, scoped);
}

/** A subcommand's body, given its options with `--tenant`, the policies bucket and the mesh. */
type ScopedCommand<O> = (
  o: O & { tenant: string | undefined },
  store: PolicyStore,
  nc: NatsConnection,
  subjects: Subjects,
) => Promise<number>;

/** Makes a subcommand's action from its body (see `addPolicyCommands`). */
type Scoped = <O extends { json?: boolean }>(fn: ScopedCommand<O>) => (given: O) => void;

/** `toolmesh policy check|replay`: decisions on one call, or on the stored calls under a candidate. */
function addPolicyEvaluation(
  policy: Command,
  config: () => RuntimeConfig,
  run: (command: () => Promise<number>) => void,
  tenantFlag: () => string | undefined,
  scoped: Scoped,
): void {
  policy
    .command("check")
    .description("print the decision on a call and the ids of the policies that made it")
    .requiredOption("--tool <name>", "the tool")
    .option(
      "--args <json>",
      "the call's arguments (as the resolver sees them: defaults filled)",
      "{}",
    )
    .option("--agent <name>", "the calling agent")
    .option("--json", "print JSON")
    .action((given: { tool: string; args: string; agent?: string; json?: boolean }) =>
      run(() => {
        const o = { ...given, tenant: tenantFlag() ?? config().tenant };
        return withPolicies(config(), o.json, (store, nc) => checkPolicy(store, nc, config(), o));
      }),
    );

  policy
    .command("replay")
    .description(
      "shadow mode: decide the calls in the call store (kept for TOOLMESH_CALL_RETENTION_MS) with a candidate set and print every decision that would change",
    )
    .argument(
      "<file>",
      "the candidate Cedar policy set (with --tenant T: in place of T's set, and only T's calls are replayed)",
    )
    .option(
      "--since <duration>",
      "only calls accepted this recently (90s, 30m, 2h, 7d)",
      durationMs,
    )
    .option("--json", "print JSON lines")
    .action((file: string, given: ScopeOptions & { since?: number }) =>
      scoped<ScopeOptions & { since?: number }>((o, store, nc, subjects) =>
        replayPolicy(store, nc, subjects, file, o),
      )(given),
    );
}

/** `policy set`: stores a valid file; a bad one is refused with line and column, changing nothing. */
async function setPolicy(
  store: PolicyStore,
  file: string,
  o: ScopeOptions & { tenant: string | undefined },
): Promise<number> {
  const text = await readPolicyFile(file);
  try {
    const stored = await store.set(text, o.tenant);
    const ids = CompiledPolicySet.compile(text).ids;
    say(
      o.json === true
        ? JSON.stringify({ revision: stored.revision, policies: ids })
        : `${whose(o.tenant)} is now version ${stored.revision} (${ids.length} policies)`,
    );
    return 0;
  } catch (err) {
    if (!(err instanceof PolicySetError) || o.json === true) throw err;
    for (const p of err.problems) say(`${file}:${p.line}:${p.column}: ${p.message}`);
    say(`toolmesh: ${file} refused; nothing changed`);
    return 1;
  }
}

/** `policy get`: the set in force, with its version. */
async function getPolicy(
  store: PolicyStore,
  o: ScopeOptions & { tenant: string | undefined },
): Promise<number> {
  const stored = await store.get(o.tenant);
  if (stored === undefined) {
    say(o.json === true ? "null" : `toolmesh: no ${whose(o.tenant).replace(/^the /, "")}`);
    return 1;
  }
  say(
    o.json === true
      ? JSON.stringify({
          revision: stored.revision,
          stored_at: new Date(stored.storedAt).toISOString(),
          text: stored.text,
        })
      : `// version ${stored.revision}, stored ${new Date(stored.storedAt).toISOString()}\n${stored.text}`,
  );
  return 0;
}

/** `policy rm`: removes the tenant's set, or the operator's when asked for by name. */
async function removePolicy(
  store: PolicyStore,
  o: ScopeOptions & { tenant: string | undefined; operator?: boolean },
): Promise<number> {
  if (o.tenant === undefined && o.operator !== true)
    throw new ToolmeshError(ErrorCode.InvalidRequest, "say whose set: --tenant T, or --operator");
  const removed = await store.rm(o.tenant);
  say(
    o.json === true ? JSON.stringify({ removed }) : removed ? "removed" : `toolmesh: no such set`,
  );
  return removed ? 0 : 1;
}

/** `policy replay`: the calls in the store decided again with a candidate set. */
async function replayPolicy(
  store: PolicyStore,
  nc: NatsConnection,
  subjects: Subjects,
  file: string,
  o: ScopeOptions & { tenant: string | undefined; since?: number },
): Promise<number> {
  const candidate = CompiledPolicySet.compile(await readPolicyFile(file));
  const counts = await replayCalls(nc, subjects, store, candidate, o);
  say(
    o.json === true
      ? JSON.stringify({ replayed: counts.replayed, changed: counts.changed })
      : `${counts.replayed} calls replayed, ${counts.changed} decisions would change`,
  );
  return 0;
}

/** `policy check`: the decision on one call, and whether catalogs list the tool. */
async function checkPolicy(
  store: PolicyStore,
  nc: NatsConnection,
  runtime: RuntimeConfig,
  o: { tool: string; args: string; agent?: string; json?: boolean; tenant: string },
): Promise<number> {
  let args: unknown;
  try {
    args = JSON.parse(o.args);
  } catch (err) {
    throw new ToolmeshError(
      ErrorCode.InvalidArguments,
      `--args is not JSON: ${(err as Error).message}`,
    );
  }
  if (typeof args !== "object" || args === null || Array.isArray(args))
    throw new ToolmeshError(ErrorCode.InvalidArguments, "--args must be a JSON object");
  const definition = await (await openForReading(nc, runtime)).fetch(o.tool);
  if (definition === undefined)
    throw new ToolmeshError(ErrorCode.UnknownTool, `unknown tool "${o.tool}"`, {
      details: { tool: o.tool },
    });
  const { current } = await deciders(store, o.tenant);
  const request = { tenant: subjectToken(o.tenant), tool: definition, agent: o.agent };
  const call = current.decide("call", {
    ...request,
    args: args as Record<string, unknown>,
  });
  const listed = current.mayList(request);
  if (o.json === true) say(JSON.stringify({ call: call ?? null, listed }));
  else {
    say(`call: ${describeDecision(call)}`);
    say(`listed in catalogs: ${listed ? "yes" : "no"}`);
  }
  return call === undefined || call.allowed ? 0 : 1;
}

async function replayCalls(
  nc: NatsConnection,
  subjects: Subjects,
  store: PolicyStore,
  candidate: CompiledPolicySet,
  o: ScopeOptions & { since?: number },
): Promise<{ replayed: number; changed: number }> {
  const calls = await new Kvm(nc).open(subjects.callsBucket, { allow_direct: false });
  const registry = await openForReading(nc, { prefix: subjects.prefix } as RuntimeConfig);
  const tools = new Map((await registry.fetchAll()).map((t) => [t.name, t]));
  const byTenant = new Map<string, Awaited<ReturnType<typeof deciders>>>();
  const tenant = o.tenant === undefined ? undefined : subjectToken(o.tenant);
  const since = o.since === undefined ? 0 : Date.now() - o.since;
  let replayed = 0;
  let changed = 0;
  if ((await calls.status()).values === 0) return { replayed, changed };
  for await (const entry of await calls.watch({ key: ">" })) {
    const mine = tenant === undefined || entry.key.startsWith(`${tenant}.`);
    // Not every key holds a call record: the resolvers' clock probe (`_clock`) is one.
    const parsed =
      mine && entry.operation === "PUT" && entry.created.getTime() >= since
        ? CallRecordSchema.safeParse(decodeJsonOrUndefined(entry.value))
        : undefined;
    if (parsed?.success === true) {
      const record = parsed.data;
      const definition = tools.get(record.tool);
      if (definition !== undefined) {
        const t = record.address.tenant;
        let pair = byTenant.get(t);
        if (pair === undefined)
          byTenant.set(
            t,
            (pair = await deciders(store, o.tenant === undefined ? undefined : t, candidate)),
          );
        const request = { tenant: t, tool: definition, session: record.address.session };
        const before = describeDecision(pair.current.decideWithoutArgs(request));
        const after = describeDecision(pair.next.decideWithoutArgs(request));
        replayed++;
        if (effectOf(before) !== effectOf(after)) {
          changed++;
          const line = { call_id: record.call_id, tenant: t, tool: record.tool, before, after };
          say(
            o.json === true
              ? JSON.stringify(line)
              : `${record.call_id} ${t} ${record.tool}: ${before} -> ${after}`,
          );
        }
      }
    }
    if (entry.delta === 0) break;
  }
  return { replayed, changed };
}
