import type { Msg } from "@nats-io/nats-core";
import { PermissionViolationError } from "@nats-io/nats-core";
import type { Command } from "commander";
import { createSubjects, decodeJsonOrUndefined } from "@toolmesh/protocol";
import type { RuntimeConfig } from "@toolmesh/runtime";
import { say } from "./print.js";
import { connectCli } from "./commands.js";
import { positiveInt } from "./option-values.js";

/** One thing seen on a session, as `watch --json` prints it. */
export interface WatchEvent {
  /** Epoch ms at which the CLI saw it. */
  at: number;
  type: "call" | "result" | "progress" | "schema";
  tenant: string;
  session: string;
  call_id?: string;
  tool?: string;
  /** The message as published (call request, final message, progress or schema event). */
  body: unknown;
}

/**
 * `toolmesh watch`: the calls, progress, schema events and final messages of one session
 * (`--session`) or of every session of the tenant, as they happen, until Ctrl-C or `--limit`
 * events. Reads core NATS subjects: nothing is consumed or acknowledged.
 */
export async function watchCommand(
  config: RuntimeConfig,
  options: { session?: string; json?: boolean; limit?: number },
): Promise<number> {
  const subjects = createSubjects({ prefix: config.prefix });
  // Any user: what it may not subscribe to is said in one line, the rest shown.
  const nc = await connectCli(config, "operator", { replies: false });
  const address =
    options.session === undefined ? undefined : subjects.address(config.tenant, options.session);
  const watched = [
    address === undefined ? subjects.tenantCalls(config.tenant) : subjects.call(address),
    address === undefined ? subjects.tenantEvents(config.tenant) : subjects.sessionEvents(address),
  ];
  let seen = 0;
  let finish: (() => void) | undefined;
  const done = new Promise<void>((resolve) => (finish = resolve));
  const show = (msg: Msg): void => {
    const event = toWatchEvent(msg, subjects.prefix);
    if (event === undefined) return;
    say(options.json === true ? JSON.stringify(event) : describe(event));
    if (options.limit !== undefined && ++seen >= options.limit) finish?.();
  };
  const subs = watched.map((subject) =>
    nc.subscribe(subject, {
      callback: (err, msg) => {
        if (err === null) show(msg);
        else process.stderr.write(`toolmesh: ${deniedWatch(err, subject)}\n`);
      },
    }),
  );
  await nc.flush();
  // On stderr even with --json: stdout stays pure JSON lines, and scripts can wait for this.
  process.stderr.write(
    `watching ${options.session === undefined ? `every session of tenant ${config.tenant}` : `session ${options.session}`} (Ctrl-C to stop)\n`,
  );
  const onSigint = (): void => finish?.();
  process.on("SIGINT", onSigint);
  try {
    await Promise.race([done, nc.closed()]);
  } finally {
    process.off("SIGINT", onSigint);
    for (const sub of subs) sub.unsubscribe();
    await nc.close();
  }
  return 0;
}

/**
 * What a subscription of `watch` that ended with `err` leaves out: a tenant's frontend may
 * subscribe to its sessions' events but not to the calls themselves.
 */
function deniedWatch(err: Error, subject: string): string {
  return err instanceof PermissionViolationError
    ? `this user may not subscribe to ${subject}: what is published there is not shown`
    : `stopped watching ${subject}: ${err.message}`;
}

function toWatchEvent(msg: Msg, prefix: string): WatchEvent | undefined {
  // {p}.v1.calls.{tenant}.{session} or {p}.v1.sessions.{tenant}.{session}.{kind}.{token}
  const parts = msg.subject.slice(prefix.length + 1).split(".");
  const [, area, tenant, session, kind] = parts;
  if (tenant === undefined || session === undefined) return undefined;
  const body = decodeJsonOrUndefined(msg.data) as Record<string, unknown> | undefined;
  const at = Date.now();
  if (area === "calls") {
    const call = body?.tool_call as { id?: unknown; function?: { name?: unknown } } | undefined;
    return {
      at,
      type: "call",
      tenant,
      session,
      ...(typeof call?.id === "string" ? { call_id: call.id } : {}),
      ...(typeof call?.function?.name === "string" ? { tool: call.function.name } : {}),
      body,
    };
  }
  if (kind !== "result" && kind !== "progress" && kind !== "schema") return undefined;
  const callId = body?.tool_call_id;
  const tool = kind === "schema" ? body?.tool : body?.name;
  return {
    at,
    type: kind,
    tenant,
    session,
    ...(typeof callId === "string" ? { call_id: callId } : {}),
    ...(typeof tool === "string" ? { tool } : {}),
    body,
  };
}

function describe(event: WatchEvent): string {
  const time = new Date(event.at).toISOString().slice(11, 23);
  const who = `${event.session} ${event.call_id ?? "-"} ${event.tool ?? ""}`.trimEnd();
  const body = (event.body ?? {}) as Record<string, unknown>;
  switch (event.type) {
    case "call":
      return `${time} ${who} call ${clip(stringify((body.tool_call as { function?: { arguments?: unknown } } | undefined)?.function?.arguments))}`;
    case "progress":
      return `${time} ${who} progress (attempt ${stringify(body.attempt)}) ${clip(stringify(body.data))}`;
    case "schema":
      return `${time} ${who} schema sent (${stringify(body.reason)})`;
    case "result": {
      const error = body.error as { code?: unknown; message?: unknown } | undefined;
      const attempts =
        typeof body.attempts === "number" ? ` after ${body.attempts} attempt(s)` : "";
      return error === undefined
        ? `${time} ${who} result${attempts}: ${clip(stringify(body.content))}`
        : `${time} ${who} error ${stringify(error.code)}${attempts}: ${clip(stringify(error.message))}`;
    }
  }
}

function stringify(value: unknown): string {
  try {
    return typeof value === "string" ? value : (JSON.stringify(value) ?? "");
  } catch {
    return "";
  }
}

function clip(text: string, max = 160): string {
  const line = text.replace(/\s+/g, " ");
  return line.length > max ? `${line.slice(0, max - 1)}…` : line;
}

/** Registers `toolmesh watch`. */
export function addWatchCommand(
  program: Command,
  config: () => RuntimeConfig,
  run: (command: () => Promise<number>) => void,
): void {
  program
    .command("watch")
    .description(
      "show a session's calls, progress, schema events and results as they happen; without --session, every session of the tenant (--tenant)",
    )
    .option("--session <id>", "the session to watch (default: every session of the tenant)")
    .option("--json", "one JSON object per line")
    .option("--limit <n>", "stop after n events", positiveInt)
    .action((o: { session?: string; json?: boolean; limit?: number }) =>
      run(() => watchCommand(config(), o)),
    );
}
