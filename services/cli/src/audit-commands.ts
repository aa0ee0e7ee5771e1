import type { Command } from "commander";
import { Option } from "commander";
import type { AuditRecord } from "@toolmesh/audit";
import { readTrail, verifyTrail } from "@toolmesh/audit";
import { JetStreamApiError } from "@nats-io/jetstream";
import { JsApiCode } from "@toolmesh/nats";
import type { Subjects } from "@toolmesh/protocol";
import { subjectToken } from "@toolmesh/protocol";
import type { RuntimeConfig } from "@toolmesh/runtime";
import { actingAsOption, asOperator } from "./commands.js";
import { durationMs } from "./policy-commands.js";
import { say } from "./print.js";

/**
 * Who reads: the operator (an ordered consumer), or the tenant's approver user from the
 * tenant's account (direct gets of its own trail only; docs/audit.md).
 */
interface ReadAs {
  as: "operator" | "approver";
}

/** The tenant has no audit stream: nothing made it, so there is no trail to read. */
export class NoAuditStreamError extends Error {
  override readonly name = "NoAuditStreamError";
}

/** Runs `read` of `tenant`'s trail; a missing audit stream says what makes it (docs/audit.md). */
async function readingTrail<T>(
  subjects: Subjects,
  tenant: string,
  read: () => Promise<T>,
): Promise<T> {
  try {
    return await read();
  } catch (err) {
    if (!(err instanceof JetStreamApiError && err.code === JsApiCode.StreamNotFound)) throw err;
    const stream = subjects.auditStream(subjectToken(tenant));
    throw new NoAuditStreamError(
      `tenant ${tenant} has no audit stream ${stream}: \`toolmesh setup --tenants ${tenant}\` ` +
        `makes it, beside the tenant's calls stream; services record into it with ` +
        `TOOLMESH_AUDIT=required (docs/audit.md)`,
      { cause: err },
    );
  }
}

/** Options of `toolmesh audit tail`. */
interface TailOptions extends ReadAs {
  call?: string;
  follow?: boolean;
  json?: boolean;
}

/** `toolmesh audit tail`: a tenant's events (of one call), one line each, optionally following. */
async function auditTailCommand(
  config: RuntimeConfig,
  tenant: string,
  options: TailOptions,
): Promise<number> {
  return asOperator(
    config,
    options.json,
    (nc, subjects) =>
      readingTrail(subjects, tenant, async () => {
        const stop = new AbortController();
        const onSignal = (): void => stop.abort();
        process.once("SIGINT", onSignal);
        try {
          for await (const { seq, record } of readTrail(nc, subjects, tenant, {
            follow: options.follow === true,
            signal: stop.signal,
            direct: options.as === "approver",
          })) {
            const event = record as AuditRecord | undefined;
            if (options.call !== undefined && event?.call_id !== options.call) continue;
            say(options.json === true ? JSON.stringify(record) : line(seq, event));
          }
        } finally {
          process.off("SIGINT", onSignal);
        }
        return 0;
      }),
    options.as,
  );
}

function line(seq: number, event: AuditRecord | undefined): string {
  if (event === undefined) return `${seq} (not an audit event)`;
  const data = Object.entries(event.data)
    .map(([k, v]) => `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`)
    .join(" ");
  return [
    seq,
    new Date(event.at).toISOString(),
    event.type,
    event.call_id ?? "-",
    event.tool ?? "-",
    data,
  ]
    .join(" ")
    .trimEnd();
}

/** `toolmesh audit verify`: recomputes the chain; the first broken link or how many passed. */
async function auditVerifyCommand(
  config: RuntimeConfig,
  tenant: string,
  options: ReadAs & { since?: number; json?: boolean },
): Promise<number> {
  return asOperator(
    config,
    options.json,
    (nc, subjects) =>
      readingTrail(subjects, tenant, async () => {
        const outcome = await verifyTrail(nc, subjects, tenant, {
          sinceMs: options.since === undefined ? undefined : Date.now() - options.since,
          direct: options.as === "approver",
        });
        if (options.json === true) say(JSON.stringify(outcome));
        else if (outcome.ok) say(`verified ${outcome.count} events`);
        else
          say(
            `broken link at event ${outcome.broken.seq}: ${outcome.broken.reason} (${outcome.count} events before it verified)`,
          );
        return outcome.ok ? 0 : 1;
      }),
    options.as,
  );
}

/** `toolmesh audit export`: a tenant's events since a time, as JSON lines. */
async function auditExportCommand(
  config: RuntimeConfig,
  tenant: string,
  options: ReadAs & { since: number },
): Promise<number> {
  return asOperator(
    config,
    true,
    (nc, subjects) =>
      readingTrail(subjects, tenant, async () => {
        for await (const { record } of readTrail(nc, subjects, tenant, {
          sinceMs: Date.now() - options.since,
          direct: options.as === "approver",
        }))
          say(JSON.stringify(record));
        return 0;
      }),
    options.as,
  );
}

/** Adds `toolmesh audit tail|verify|export` (docs/audit.md). */
export function addAuditCommands(
  program: Command,
  config: () => RuntimeConfig,
  run: (command: () => Promise<number>) => void,
): void {
  // `--tenant` is the program's own option (given before or after the subcommand).
  const tenantOf = (): string => program.opts<{ tenant?: string }>().tenant ?? config().tenant;
  const audit = program
    .command("audit")
    .description("read and verify tenants' audit trails (docs/audit.md)");
  audit
    .command("tail")
    .description("print a tenant's audit events, oldest first (--tenant, default TOOLMESH_TENANT)")
    .option("--call <id>", "only the events of this call")
    .option("--follow", "keep printing events as they are written (Ctrl-C stops)")
    .option("--json", "print each event as JSON")
    .addOption(actingAsOption())
    .action((o: TailOptions) => run(() => auditTailCommand(config(), tenantOf(), o)));
  audit
    .command("verify")
    .description(
      'recompute a tenant\'s hash chain: prints "verified N events" or the first broken link (exit 1)',
    )
    .addOption(
      new Option("--since <duration>", "only events of the last 30m, 2h, 7d…").argParser(
        durationMs,
      ),
    )
    .option("--json", "print JSON")
    .addOption(actingAsOption())
    .action((o: ReadAs & { since?: number; json?: boolean }) =>
      run(() => auditVerifyCommand(config(), tenantOf(), o)),
    );
  audit
    .command("export")
    .description("print a tenant's audit events since a time as JSON lines (for a SIEM)")
    .addOption(
      new Option("--since <duration>", "events of the last 30m, 2h, 7d…")
        .argParser(durationMs)
        .makeOptionMandatory(),
    )
    .addOption(actingAsOption())
    .action((o: ReadAs & { since: number }) =>
      run(() => auditExportCommand(config(), tenantOf(), o)),
    );
}
