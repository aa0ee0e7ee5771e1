import type { Command } from "commander";
import type { FieldChange, ProvisionChange } from "@toolmesh/nats";
import { assertServerSupported, connectNats, meshPlan, provisionMesh } from "@toolmesh/nats";
import { createSubjects } from "@toolmesh/protocol";
import type { RuntimeConfig } from "@toolmesh/runtime";
import { meshSettings } from "@toolmesh/runtime";
import { say } from "./print.js";

/** Options of `toolmesh setup`. */
export interface SetupOptions {
  dryRun?: boolean;
  json?: boolean;
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
  const nc = await connectNats({
    ...config.nats,
    name: "toolmesh-setup",
    inboxPrefix: createSubjects({ prefix: config.prefix }).inboxPrefix("setup"),
  });
  try {
    await assertServerSupported(nc);
    const plan = meshPlan(createSubjects({ prefix: config.prefix }), meshSettings(config));
    const changes = await provisionMesh(nc, plan, { dryRun });
    const changed = changes.filter((c) => c.action !== "unchanged");
    if (options.json === true) {
      say(
        JSON.stringify({
          dry_run: dryRun,
          server: nc.getServer(),
          replicas: config.streamReplicas,
          changed: changed.length,
          resources: changes,
        }),
      );
      return 0;
    }
    for (const change of changes) say(line(change, dryRun));
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
    .action((o: { replicas?: string; dryRun?: boolean; json?: boolean }) =>
      run(() =>
        setupCommand(config({ TOOLMESH_STREAM_REPLICAS: o.replicas }), {
          dryRun: o.dryRun === true,
          json: o.json === true,
        }),
      ),
    );
}
