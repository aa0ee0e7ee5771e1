import type { Command } from "commander";
import { Option } from "commander";
import type { RuntimeConfig } from "@toolmesh/runtime";
import type { SortKey } from "./stats-command.js";
import { SORT_KEYS, renderStats, withStats } from "./stats-command.js";
import { positiveInt } from "./option-values.js";

/** Options of `toolmesh top`. */
export interface TopOptions {
  sort: SortKey;
  filter?: string;
  /** Only this tenant in the tenants table. */
  tenant?: string;
  /** Refresh period, in ms. */
  intervalMs: number;
  /** Stop after this many refreshes (for scripts); default until `q` or Ctrl-C. */
  iterations?: number;
}

/**
 * `toolmesh top`: the stats, refreshed every interval on the terminal's alternate screen.
 * Keys: `s` next sort column, `r` reverse, `/` type a filter (Enter ends it), `q` or Ctrl-C quit.
 * Without a terminal it prints one frame per refresh.
 */
export async function topCommand(config: RuntimeConfig, options: TopOptions): Promise<number> {
  const out = process.stdout;
  const input = process.stdin;
  const live = out.isTTY === true;
  let sort = options.sort;
  let reverse = false;
  let filter = options.filter;
  let typing: string | undefined;
  let quit: (() => void) | undefined;
  const stopped = new Promise<void>((resolve) => (quit = resolve));
  let redraw: (() => void) | undefined;

  const onKey = (chunk: Buffer): void => {
    for (const key of chunk.toString("utf8")) {
      if (typing !== undefined) {
        if (key === "\r" || key === "\n") {
          filter = typing === "" ? undefined : typing;
          typing = undefined;
        } else if (key === "\x7f" || key === "\b") typing = typing.slice(0, -1);
        else if (key === "\x1b") typing = undefined;
        else if (key >= " ") typing += key;
      } else if (key === "q" || key === "\x03") quit?.();
      else if (key === "s") sort = SORT_KEYS[(SORT_KEYS.indexOf(sort) + 1) % SORT_KEYS.length]!;
      else if (key === "r") reverse = !reverse;
      else if (key === "/") typing = "";
      redraw?.();
    }
  };
  if (live && input.isTTY === true) {
    input.setRawMode(true);
    input.resume();
    input.on("data", onKey);
  }
  const onSigint = (): void => quit?.();
  process.on("SIGINT", onSigint);
  if (live) out.write("\x1b[?1049h\x1b[?25l");
  try {
    return await withStats(
      config,
      async (gather) => {
        let latest = await gather();
        redraw = () => {
          const lines = renderStats(latest, {
            sort,
            reverse,
            ...(filter === undefined ? {} : { filter }),
            width: out.columns ?? 120,
          });
          const status =
            typing !== undefined
              ? `filter: ${typing}█`
              : `toolmesh top · ${new Date(latest.at).toISOString().slice(11, 19)} · sort ${sort}${reverse ? " (reversed)" : ""}${filter === undefined ? "" : ` · filter "${filter}"`} · s sort  r reverse  / filter  q quit`;
          if (live) out.write(`\x1b[H\x1b[2J${[status, "", ...lines].join("\r\n")}\r\n`);
          else out.write(`${[status, ...lines].join("\n")}\n\n`);
        };
        for (let frame = 1; ; frame++) {
          redraw();
          if (options.iterations !== undefined && frame >= options.iterations) return 0;
          const next = await Promise.race([
            new Promise<"tick">((resolve) => setTimeout(() => resolve("tick"), options.intervalMs)),
            stopped.then(() => "quit" as const),
          ]);
          if (next === "quit") return 0;
          latest = await gather();
        }
      },
      options.tenant === undefined ? {} : { tenant: options.tenant },
    );
  } finally {
    process.off("SIGINT", onSigint);
    if (live) out.write("\x1b[?25h\x1b[?1049l");
    if (live && input.isTTY === true) {
      input.off("data", onKey);
      input.setRawMode(false);
      input.pause();
    }
  }
}

/** Registers `toolmesh top`. */
export function addTopCommand(
  program: Command,
  config: () => RuntimeConfig,
  run: (command: () => Promise<number>) => void,
): void {
  program
    .command("top")
    .description("the stats, refreshed live: s sorts, r reverses, / filters, q quits")
    .addOption(new Option("--sort <column>", "sort column").choices(SORT_KEYS).default("calls"))
    .option("--filter <text>", "only tools whose name contains this")
    .option("--tenant <id>", "in the tenants table, only this tenant")
    .addOption(
      new Option("--interval-ms <n>", "refresh period in ms").argParser(positiveInt).default(2000),
    )
    .addOption(new Option("--iterations <n>", "stop after n refreshes").argParser(positiveInt))
    .action((o: TopOptions) => run(() => topCommand(config(), o)));
}
