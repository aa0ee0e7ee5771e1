import type { Command } from "commander";
import type { FieldChange, ProvisionChange } from "@toolmesh/nats";
import type { NatsConnection } from "@nats-io/nats-core";
import { JetStreamApiCodes, JetStreamApiError, jetstreamManager } from "@nats-io/jetstream";
import {
  assertServerSupported,
  bucketStream,
  connectNats,
  meshPlan,
  obsoleteStreams,
  provisionMesh,
  provisionOwnerWork,
  provisionTenantCalls,
  storeBudget,
} from "@toolmesh/nats";
import type { Subjects } from "@toolmesh/protocol";
import { createSubjects } from "@toolmesh/protocol";
import type { RuntimeConfig } from "@toolmesh/runtime";
import { meshSettings } from "@toolmesh/runtime";
import { say } from "./print.js";
import { commaList } from "./comma-list.js";
import { checkAccountId } from "@toolmesh/nats";

/** Options of `toolmesh setup`. */
export interface SetupOptions {
  dryRun?: boolean;
  json?: boolean;
  /** Delete the streams earlier versions created that the mesh no longer uses. */
  removeObsolete?: boolean;
  /** Tool owners whose work streams to create now (ADR 0041); existing ones are kept up to date. */
  owners?: readonly string[];
  /**
   * Tenants with accounts whose calls streams to create now (ADR 0048); existing ones are kept
   * up to date.
   */
  tenants?: readonly string[];
}

function field(change: FieldChange): string {
  const by = change.setting === undefined ? "" : ` (${change.setting})`;
  return `${change.field} ${JSON.stringify(change.from)} -> ${JSON.stringify(change.to)}${by}`;
}

function line(change: ProvisionChange, dryRun: boolean): string {
  const verb = dryRun
    ? { created: "would create", updated: "would update", unchanged: "unchanged" }[change.action]
    : change.action;
  const what = `${verb} ${change.kind} ${change.name}`;
  return change.changes.length === 0 ? what : `${what}: ${change.changes.map(field).join(", ")}`;
}

/**
 * `toolmesh setup`: creates or updates every stream, KV bucket and shared consumer the mesh
 * needs, as the configuration says, and prints what it changed. Running it again changes
 * nothing. Exit code 0 when everything matches the configuration afterwards.
 */
export async function setupCommand(config: RuntimeConfig, options: SetupOptions): Promise<number> {
  const dryRun = options.dryRun === true;
  // The ids `toolmesh auth config` accepts, before anything is made for them.
  for (const owner of options.owners ?? []) checkAccountId("owner", owner);
  for (const tenant of options.tenants ?? []) checkAccountId("tenant", tenant);
  const nc = await connectNats({
    ...config.nats,
    name: "toolmesh-setup",
    inboxPrefix: createSubjects({ prefix: config.prefix }).inboxPrefix("setup"),
  });
  try {
    await assertServerSupported(nc);
    const subjects = createSubjects({ prefix: config.prefix });
    const settings = meshSettings(config);
    const changes = await provisionMesh(nc, meshPlan(subjects, settings), { dryRun });
    changes.push(
      ...(await provisionOwnerWork(nc, subjects, settings, options.owners ?? [], { dryRun })),
      ...(await provisionTenantCalls(nc, subjects, settings, options.tenants ?? [], { dryRun })),
    );
    const changed = changes.filter((c) => c.action !== "unchanged");
    const budget = await storageBudget(nc, subjects, config, changes);
    const obsolete = await findObsolete(nc, createSubjects({ prefix: config.prefix }));
    const remove = options.removeObsolete === true && !dryRun;
    if (remove) {
      const jsm = await jetstreamManager(nc);
      for (const name of obsolete) await jsm.streams.delete(name);
    }
    if (options.json === true) {
      say(
        JSON.stringify({
          dry_run: dryRun,
          server: nc.getServer(),
          replicas: config.streamReplicas,
          changed: changed.length,
          resources: changes,
          budget,
          obsolete: obsolete.map((name) => ({
            kind: "stream",
            name,
            action: remove ? "deleted" : "kept",
          })),
        }),
      );
      return 0;
    }
    for (const change of changes) say(line(change, dryRun));
    for (const text of budgetLines(budget)) say(text);
    for (const name of obsolete)
      say(
        remove
          ? `deleted obsolete stream ${name}`
          : `obsolete stream ${name}: no longer used; once no older resolver runs, delete it with toolmesh setup --remove-obsolete`,
      );
    say(
      changed.length === 0
        ? `nothing to change: ${changes.length} resources match the configuration`
        : `${changed.length} of ${changes.length} resources ${dryRun ? "would change" : "changed"}`,
    );
    return 0;
  } finally {
    await nc.close();
  }
}

/** What the streams may hold, by stream and together, against what the account may store. */
export interface StorageBudget {
  /** Each stream the mesh bounds, with its `max_bytes`. */
  streams: { stream: string; max_bytes: number; setting: string }[];
  /** The sum of every stream's `max_bytes`. */
  total_bytes: number;
  /** The account's JetStream file storage limit; -1 when the server sets none (or it is unknown). */
  account_max_bytes: number;
  /** What the account stores now, in bytes; -1 when these credentials may not read it. */
  account_used_bytes: number;
  /**
   * What each tenant's results may occupy (`TOOLMESH_TENANT_MAX_STORED_BYTES`, 0: unbounded), how
   * many tenants at that bound the sessions stream and the call records hold, and how many
   * tenant accounts `setup` provisioned.
   */
  tenant_results: { max_bytes_each: number; tenants_that_fit: number; tenants_named: number };
}

/** The byte bound of every stream `setup` made or checked (ADR 0050). */
async function storageBudget(
  nc: NatsConnection,
  subjects: Subjects,
  config: RuntimeConfig,
  changes: readonly ProvisionChange[],
): Promise<StorageBudget> {
  const settings = meshSettings(config);
  const streams = storeBudget(subjects, settings).map((b) => ({
    stream: b.stream,
    max_bytes: b.maxBytes,
    setting: "TOOLMESH_STORE_BYTES",
  }));
  for (const change of changes) {
    if (change.kind !== "stream") continue;
    const tenant =
      (subjects.isCallsStream(change.name) && change.name !== subjects.streams.calls) ||
      change.name.startsWith(subjects.auditStream(""));
    const owner = subjects.isWorkStream(change.name) && change.name !== subjects.streams.work;
    if (tenant)
      streams.push({
        stream: change.name,
        max_bytes: config.tenantStoreBytes,
        setting: "TOOLMESH_TENANT_STORE_BYTES",
      });
    if (owner)
      streams.push({
        stream: change.name,
        max_bytes: config.ownerStoreBytes,
        setting: "TOOLMESH_OWNER_STORE_BYTES",
      });
  }
  const resultStores = [subjects.streams.sessions, bucketStream(subjects.callsBucket)];
  const results = Math.min(
    ...streams.filter((s) => resultStores.includes(s.stream)).map((s) => s.max_bytes),
  );
  const each = config.tenantMaxStoredBytes;
  const tenant_results = {
    max_bytes_each: each,
    tenants_that_fit: each > 0 ? Math.floor(results / each) : 0,
    tenants_named: streams.filter((s) => s.setting === "TOOLMESH_TENANT_STORE_BYTES").length,
  };
  // Credentials that may not read the account's JetStream info still get the streams' budget.
  const info = await (await jetstreamManager(nc)).getAccountInfo().catch(() => undefined);
  return {
    streams,
    total_bytes: streams.reduce((sum, s) => sum + s.max_bytes, 0),
    account_max_bytes: info?.limits.max_storage ?? -1,
    account_used_bytes: info?.storage ?? -1,
    tenant_results,
  };
}

function mib(bytes: number): string {
  return `${(bytes / 1024 ** 2).toFixed(1)} MiB`;
}

/** The budget as `setup` prints it, one line a stream, then the total. */
function budgetLines(budget: StorageBudget): string[] {
  const lines = budget.streams.map(
    (s) => `budget ${s.stream}: at most ${mib(s.max_bytes)} (${s.setting})`,
  );
  const limit =
    budget.account_used_bytes < 0
      ? "the account's storage limit is not readable with these credentials"
      : budget.account_max_bytes < 0
        ? "the account has no JetStream storage limit of its own"
        : `the account may store ${mib(budget.account_max_bytes)}`;
  const used =
    budget.account_used_bytes < 0 ? "" : `, stores ${mib(budget.account_used_bytes)} now`;
  lines.push(
    `budget total: ${mib(budget.total_bytes)} of streams (${budget.streams.length}), ${limit}${used}`,
  );
  const { tenant_results: r } = budget;
  lines.push(
    r.max_bytes_each > 0
      ? `budget results: at most ${mib(r.max_bytes_each)} per tenant (TOOLMESH_TENANT_MAX_STORED_BYTES); the sessions stream and the call records hold ${r.tenants_that_fit} tenants at that bound`
      : "budget results: no bound per tenant (TOOLMESH_TENANT_MAX_STORED_BYTES=0); one tenant's results may drop every other tenant's stored answers",
  );
  if (r.max_bytes_each > 0 && r.tenants_named > r.tenants_that_fit)
    lines.push(
      `budget warning: ${r.tenants_named} tenant accounts at their bound may store more results than the sessions stream and the call records hold; raise TOOLMESH_STORE_BYTES or lower TOOLMESH_TENANT_MAX_STORED_BYTES`,
    );
  if (budget.account_max_bytes >= 0 && budget.total_bytes > budget.account_max_bytes)
    lines.push(
      "budget warning: the streams may hold more than the account may store; lower TOOLMESH_STORE_BYTES, TOOLMESH_TENANT_STORE_BYTES or TOOLMESH_OWNER_STORE_BYTES",
    );
  return lines;
}

/** The obsolete streams that exist on the server. */
async function findObsolete(nc: NatsConnection, subjects: Subjects): Promise<string[]> {
  const jsm = await jetstreamManager(nc);
  const found: string[] = [];
  for (const name of obsoleteStreams(subjects)) {
    const exists = await jsm.streams.info(name).then(
      () => true,
      (err: unknown) => {
        if (err instanceof JetStreamApiError && err.code === JetStreamApiCodes.StreamNotFound)
          return false;
        throw err;
      },
    );
    if (exists) found.push(name);
  }
  return found;
}

/** Registers `toolmesh setup` on the program. */
export function addSetupCommand(
  program: Command,
  config: (extra?: Partial<Record<string, string | undefined>>) => RuntimeConfig,
  run: (command: () => Promise<number>) => void,
): void {
  program
    .command("setup")
    .description(
      "create or update every stream, KV bucket and shared consumer the mesh needs (run with admin credentials)",
    )
    .option("--replicas <n>", "replicas of every stream and bucket (TOOLMESH_STREAM_REPLICAS)")
    .option("--dry-run", "print what would change, change nothing")
    .option("--json", "print one JSON object")
    .option(
      "--remove-obsolete",
      "delete the streams earlier versions created that the mesh no longer uses (TIMERS)",
    )
    .option(
      "--owners <ids>",
      "tool owners with accounts whose work streams (PREFIX_WORK_OWNER) to create now, their max-deliveries advisories kept in PREFIX_ADVISORIES; existing ones are always brought up to date",
      commaList,
    )
    .option(
      "--tenants <ids>",
      "tenants with accounts whose calls streams (PREFIX_CALLS_TENANT, at most TOOLMESH_MAX_QUEUED_CALLS_PER_TENANT calls each) to create now: run it before a new tenant's first call; existing ones are always brought up to date",
      commaList,
    )
    .action(
      (o: {
        replicas?: string;
        dryRun?: boolean;
        json?: boolean;
        removeObsolete?: boolean;
        owners?: string[];
        tenants?: string[];
      }) =>
        run(() =>
          setupCommand(config({ TOOLMESH_STREAM_REPLICAS: o.replicas }), {
            dryRun: o.dryRun === true,
            json: o.json === true,
            removeObsolete: o.removeObsolete === true,
            ...(o.owners === undefined ? {} : { owners: o.owners }),
            ...(o.tenants === undefined ? {} : { tenants: o.tenants }),
          }),
        ),
    );
}
