import type { DeadLetter } from "@toolmesh/control-plane";
import {
  listDeadLetters,
  purgeDeadLetters,
  replayDeadLetter,
  showDeadLetter,
} from "@toolmesh/control-plane";
import type { RuntimeConfig } from "@toolmesh/runtime";
import { asOperator } from "./commands.js";
import { say } from "./print.js";

/** Options of `toolmesh dlq list`. */
export interface DlqListOptions {
  tool?: string;
  /** Most letters printed, oldest first. Default 100. */
  limit?: number;
  json?: boolean;
}

/** `toolmesh dlq list`: the dead letters, oldest first, one line each. */
export async function dlqListCommand(
  config: RuntimeConfig,
  options: DlqListOptions,
): Promise<number> {
  return asOperator(config, options.json, async (nc, subjects) => {
    const letters = await listDeadLetters(nc, subjects, {
      ...(options.tool === undefined ? {} : { tool: options.tool }),
      ...(options.limit === undefined ? {} : { limit: options.limit }),
    });
    if (options.json === true) say(JSON.stringify(letters));
    else if (letters.length === 0) say("no dead letters");
    else for (const line of table(letters)) say(line);
    return 0;
  });
}

/** `toolmesh dlq show`: one dead letter with its body. */
export async function dlqShowCommand(
  config: RuntimeConfig,
  seq: number,
  options: { json?: boolean },
): Promise<number> {
  return asOperator(config, options.json, async (nc, subjects) => {
    const letter = await showDeadLetter(nc, subjects, seq);
    say(options.json === true ? JSON.stringify(letter) : JSON.stringify(letter, null, 2));
    return 0;
  });
}

/**
 * `toolmesh dlq replay`: runs a dead-lettered call again; its session gets a new final
 * message (an explicit override of "exactly one final message"). The letter is deleted.
 */
export async function dlqReplayCommand(
  config: RuntimeConfig,
  seq: number,
  options: { json?: boolean },
): Promise<number> {
  return asOperator(config, options.json, async (nc, subjects) => {
    const outcome = await replayDeadLetter(nc, subjects, seq, {
      callRetentionMs: config.callRetentionMs,
    });
    if (options.json === true) say(JSON.stringify(outcome));
    else if (outcome.status === "already_done")
      say(
        `dead letter ${seq} was replayed before as ${outcome.idempotency_key}, ` +
          `which has ended; nothing published${outcome.deleted ? "; letter deleted" : ""}`,
      );
    else
      say(
        `dead letter ${seq} replayed on ${outcome.subject} as ${outcome.idempotency_key}; ` +
          `call ${outcome.call_id} of session ${outcome.session_id} will get a new final ` +
          `message${outcome.deleted ? "; letter deleted" : ""}`,
      );
    return 0;
  });
}

/** `toolmesh dlq purge`: removes the letters (of one tool) and says what space it gave back. */
export async function dlqPurgeCommand(
  config: RuntimeConfig,
  options: { tool?: string; json?: boolean },
): Promise<number> {
  return asOperator(config, options.json, async (nc, subjects) => {
    const outcome = await purgeDeadLetters(
      nc,
      subjects,
      options.tool === undefined ? {} : { tool: options.tool },
    );
    if (options.json === true) say(JSON.stringify(outcome));
    else
      say(
        `purged ${outcome.purged} dead letters; the dead-letter stream holds ` +
          `${outcome.bytes_after} bytes (was ${outcome.bytes_before}), ${outcome.letters_after} letters`,
      );
    return 0;
  });
}

function table(letters: readonly DeadLetter[]): string[] {
  const rows = letters.map((l) => [
    String(l.seq),
    l.time,
    l.tool,
    l.reason,
    String(l.deliveries),
    l.original_seq === undefined ? l.stream : `${l.stream}:${l.original_seq}`,
    l.call_id === undefined ? "-" : `${l.tenant ?? "?"}/${l.session_id ?? ""}/${l.call_id}`,
    l.suspect === undefined ? "" : `SUSPECT: ${l.suspect}`,
  ]);
  const header = ["SEQ", "TIME", "TOOL", "REASON", "DELIVERIES", "FROM", "CALL", ""];
  const all = [header, ...rows];
  const widths = header.map((_, i) => Math.max(...all.map((r) => (r[i] ?? "").length)));
  return all.map((r) =>
    r
      .map((cell, i) => cell.padEnd(widths[i] ?? 0))
      .join("  ")
      .trimEnd(),
  );
}
