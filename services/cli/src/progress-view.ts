import type { ProgressEvent } from "@toolmesh/protocol";

/** Where `toolmesh call` shows what a waiting call is doing. */
export interface ProgressView {
  /** A progress event of the call. */
  progress(event: ProgressEvent): void;
  /** Something the user should know now (what is missing, a cancellation). */
  notice(text: string): void;
  /** Clears what the view drew; later calls do nothing. */
  stop(): void;
}

const SPINNER = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"];
const BAR_WIDTH = 20;

/**
 * A spinner (or a bar, once the tool reports `progress` out of `total`) redrawn on one line when
 * `stream` is a terminal; one plain line per event otherwise; nothing when `quiet`.
 */
export function progressView(
  stream: NodeJS.WriteStream,
  options: { quiet: boolean; tool: string; now?: () => number },
): ProgressView {
  if (options.quiet) return { progress: () => undefined, notice: () => undefined, stop: () => {} };
  const now = options.now ?? Date.now;
  const started = now();
  if (stream.isTTY !== true) {
    return {
      progress: (event) =>
        stream.write(`progress ${options.tool} (attempt ${event.attempt}): ${describe(event)}\n`),
      notice: (text) => stream.write(`toolmesh: ${text}\n`),
      stop: () => undefined,
    };
  }

  let frame = 0;
  let last: ProgressEvent | undefined;
  let stopped = false;
  const draw = (): void => {
    const elapsed = ((now() - started) / 1000).toFixed(1);
    const fraction = last === undefined ? undefined : fractionOf(last.data);
    const head =
      fraction === undefined
        ? (SPINNER[frame++ % SPINNER.length] ?? "")
        : `[${"#".repeat(Math.round(fraction * BAR_WIDTH)).padEnd(BAR_WIDTH, "-")}] ${Math.round(fraction * 100)}%`;
    const detail = last === undefined ? "waiting" : describe(last);
    const line = `${head} ${options.tool} ${elapsed}s ${detail}`;
    const width = Math.max(20, (stream.columns ?? 80) - 1);
    stream.write(`\r\x1b[K${line.length > width ? line.slice(0, width) : line}`);
  };
  const timer = setInterval(draw, 100);
  timer.unref();
  draw();
  return {
    progress: (event) => {
      last = event;
      draw();
    },
    notice: (text) => {
      stream.write(`\r\x1b[Ktoolmesh: ${text}\n`);
      draw();
    },
    stop: () => {
      if (stopped) return;
      stopped = true;
      clearInterval(timer);
      stream.write("\r\x1b[K");
    },
  };
}

/** `progress / total` of MCP-style progress data, when it has both. */
function fractionOf(data: unknown): number | undefined {
  const { progress, total } = (typeof data === "object" && data !== null ? data : {}) as {
    progress?: unknown;
    total?: unknown;
  };
  if (typeof progress !== "number" || typeof total !== "number" || total <= 0) return undefined;
  return Math.min(1, Math.max(0, progress / total));
}

function describe(event: ProgressEvent): string {
  const data = event.data as { message?: unknown } | undefined;
  if (typeof data === "object" && data !== null && typeof data.message === "string")
    return data.message;
  if (typeof event.data === "string") return event.data;
  try {
    return JSON.stringify(event.data) ?? "";
  } catch {
    return "";
  }
}
