import type { NatsConnection } from "@nats-io/nats-core";
import { JetStreamApiError, jetstreamManager } from "@nats-io/jetstream";
import { ToolmeshClient } from "@toolmesh/client";
import type { SubmitOptions } from "@toolmesh/client";
import type { Subjects, ToolMessage } from "@toolmesh/protocol";
import { ErrorCode, ToolmeshError } from "@toolmesh/protocol";
import { JsApiCode } from "@toolmesh/nats";
import type { RuntimeConfig } from "@toolmesh/runtime";
import { initTelemetry } from "@toolmesh/telemetry";
import { describeMessage, say } from "./print.js";
import { progressView } from "./progress-view.js";
import { connectCli, withClient } from "./commands.js";
import { workStreams } from "./stats.js";

/** Options of `toolmesh call` (and of `resolve`, which ignores `quiet`). */
export interface CallOptions {
  args?: string;
  session?: string;
  timeoutMs?: number;
  json?: boolean;
  idempotencyKey?: string;
  agent?: string;
  /** Call-level execution context, JSON text of an object. */
  context?: string;
  quiet?: boolean;
}

/** How long a call may go untaken before `toolmesh call` says what is missing, in ms. */
export const UNTAKEN_NOTICE_MS = 2_000;
// Spans still unsent when the call has ended get this long to leave; a dead collector costs no more.
const TELEMETRY_FLUSH_MS = 2_000;

/** A new session id for a one-off call. */
export function newSessionId(): string {
  return `cli-${Date.now().toString(36)}-${process.pid}`;
}

/** The submit options the flags give; `--context` must be a JSON object. */
export function submitOptionsOf(options: CallOptions): SubmitOptions {
  let context: Record<string, unknown> | undefined;
  if (options.context !== undefined) {
    let parsed: unknown;
    try {
      parsed = JSON.parse(options.context);
    } catch (err) {
      throw new ToolmeshError(
        ErrorCode.InvalidRequest,
        `--context is not JSON: ${(err as Error).message}`,
      );
    }
    if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed))
      throw new ToolmeshError(ErrorCode.InvalidRequest, "--context must be a JSON object");
    context = parsed as Record<string, unknown>;
  }
  return {
    ...(options.timeoutMs === undefined ? {} : { timeoutMs: options.timeoutMs }),
    ...(options.idempotencyKey === undefined ? {} : { idempotencyKey: options.idempotencyKey }),
    ...(options.agent === undefined ? {} : { agent: options.agent }),
    ...(context === undefined ? {} : { context }),
  };
}

/**
 * `toolmesh call`: publishes one call, shows its progress on stderr while it waits, says what is
 * missing when no resolver or executor takes it, cancels it on Ctrl-C, and prints its final
 * message. Exit 1 when the call ended in error, 130 when cancelled by Ctrl-C. The call's spans
 * are exported when `OTEL_EXPORTER_OTLP_*` is set.
 */
export async function callCommand(
  config: RuntimeConfig,
  tool: string,
  options: CallOptions,
): Promise<number> {
  const submitOptions = submitOptionsOf(options);
  const telemetry = initTelemetry({ serviceName: "toolmesh-cli", env: config.env });
  try {
    const nc = await connectCli(config, "frontend");
    try {
      return await runCall(nc, config, tool, options, submitOptions);
    } finally {
      await nc.close();
    }
  } finally {
    await Promise.race([
      telemetry.shutdown(),
      new Promise((resolve) => setTimeout(resolve, TELEMETRY_FLUSH_MS).unref()),
    ]);
  }
}

async function runCall(
  nc: NatsConnection,
  config: RuntimeConfig,
  tool: string,
  options: CallOptions,
  submitOptions: SubmitOptions,
): Promise<number> {
  const client = new ToolmeshClient(nc, {
    prefix: config.prefix,
    tenant: config.tenant,
    defaultTimeoutMs: config.defaultTimeoutMs,
  });
  const session = client.session(options.session ?? newSessionId());
  const view = progressView(process.stderr, { quiet: options.quiet === true, tool });
  let interrupted = false;
  let ended = false;
  let onSigint: (() => void) | undefined;
  let watchdog: NodeJS.Timeout | undefined;
  try {
    const handle = session.submit({ name: tool, arguments: options.args ?? "{}" }, submitOptions);
    let heard = false;
    const stopListening = session.onEvent((event) => {
      if (event.type === "progress" && event.event.tool_call_id === handle.callId) {
        heard = true;
        view.progress(event.event);
      }
    });
    onSigint = () => {
      if (interrupted) process.exit(130);
      interrupted = true;
      view.notice(`cancelling call ${handle.callId} (Ctrl-C again to exit now)`);
      void handle.cancel().then((reply) => {
        // Without an error the final message (cancelled) follows; once it came, an error is
        // only the connection closing after it.
        if (reply.error === undefined || ended) return;
        view.stop();
        process.stderr.write(`toolmesh: cannot cancel the call: ${reply.error.message}\n`);
        process.exit(130);
      });
    };
    process.on("SIGINT", onSigint);
    let lastNotice: string | undefined;
    const check = (): void => {
      watchdog = undefined;
      if (heard) return;
      void whatIsMissing(nc, client.subjects, tool).then((missing) => {
        if (missing !== undefined && missing !== lastNotice) view.notice(missing);
        lastNotice = missing;
        watchdog ??= setTimeout(check, UNTAKEN_NOTICE_MS * 2);
      });
    };
    watchdog = setTimeout(check, UNTAKEN_NOTICE_MS);
    const message: ToolMessage = await handle.result;
    ended = true;
    stopListening();
    view.stop();
    say(options.json === true ? JSON.stringify(message) : describeMessage(message));
    if (interrupted) return 130;
    return message.error === undefined ? 0 : 1;
  } finally {
    clearTimeout(watchdog);
    view.stop();
    if (onSigint !== undefined) process.off("SIGINT", onSigint);
    session.close();
  }
}

/** `toolmesh resolve`: prints the resolved-call record without executing the call. */
export async function resolveCommand(
  config: RuntimeConfig,
  tool: string,
  options: CallOptions,
): Promise<number> {
  const submitOptions = submitOptionsOf(options);
  return withClient(config, async (client) => {
    const reply = await client.resolve(
      options.session ?? newSessionId(),
      { name: tool, arguments: options.args ?? "{}" },
      submitOptions,
    );
    if (options.json === true)
      say(JSON.stringify(reply.ok ? reply.resolved : { error: reply.error }));
    else if (reply.ok) say(JSON.stringify(reply.resolved, null, 2));
    else say(`${reply.error.code}: ${reply.error.message}`);
    return reply.ok ? 0 : 1;
  });
}

/**
 * Why a call is still untaken, read from JetStream: no resolver pulling from the calls stream,
 * or no executor pulling the tool's work. Undefined when both are there (the call is running or
 * queued behind others).
 */
export async function whatIsMissing(
  nc: NatsConnection,
  subjects: Subjects,
  tool: string,
): Promise<string | undefined> {
  try {
    const jsm = await jetstreamManager(nc);
    const resolver = await jsm.consumers
      .info(subjects.streams.calls, subjects.resolverConsumer)
      .catch((err: unknown) =>
        err instanceof JetStreamApiError && err.code === JsApiCode.StreamNotFound
          ? ("no stream" as const)
          : undefined,
      );
    if (resolver === "no stream") {
      return `no stream ${subjects.streams.calls} stores the calls of prefix ${subjects.prefix}: the call cannot be queued (check --prefix or TOOLMESH_PREFIX; toolmesh setup makes the streams)`;
    }
    if (resolver === undefined || resolver.num_waiting === 0) {
      return "no resolver is running: the call stays queued until one starts";
    }
    // On the mesh's work stream, or on its owner's (ADR 0041).
    const work = (
      await Promise.all(
        (await workStreams(jsm, subjects)).map((stream) =>
          jsm.consumers.info(stream, subjects.workConsumer(tool)).catch(() => undefined),
        ),
      )
    ).filter((info) => info !== undefined);
    if (work.length === 0) {
      return `no executor serves "${tool}": the call stays queued until one starts`;
    }
    if (work.every((info) => info.num_waiting === 0)) {
      const queued = work.reduce((n, info) => n + info.num_pending + info.num_ack_pending, 0);
      return `no executor serving "${tool}" is running: the call stays queued (${queued} waiting) until one starts`;
    }
    return undefined;
  } catch {
    return undefined;
  }
}
