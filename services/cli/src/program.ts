import { addAuditCommands } from "./audit-commands.js";
import { Command, Option } from "commander";
import type { RuntimeConfig } from "@toolmesh/runtime";
import { loadConfig, serveActors } from "@toolmesh/runtime";
import type { Role } from "./actors.js";
import { ROLES, startActors } from "./actors.js";
import { addToolApprovalCommand } from "./approve-command.js";
import { addImportOpenApiCommand } from "./import-openapi-command.js";
import { addCatalogCommands } from "./catalog-commands.js";
import { toolsListCommand, toolsShowCommand } from "./commands.js";
import type { CallOptions } from "./call-command.js";
import { callCommand, resolveCommand } from "./call-command.js";
import { addCancelCommand } from "./cancel-command.js";
import { addStatsCommand } from "./stats-command.js";
import { addTopCommand } from "./top-command.js";
import { addWatchCommand } from "./watch-command.js";
import { addVersionEverywhere, cliVersion } from "./version.js";
import {
  dlqListCommand,
  dlqPurgeCommand,
  dlqReplayCommand,
  dlqShowCommand,
} from "./dlq-commands.js";
import { addSetupCommand } from "./setup.js";
import { addQuotaCommands } from "./quota-commands.js";
import { addPolicyCommands } from "./policy-commands.js";
import { addSecretsCommands } from "./secrets-commands.js";
import { addApprovalCommands } from "./approvals-commands.js";
import { addAuthCommands } from "./auth-commands.js";
import { positiveInt } from "./option-values.js";
import { oneLineUsageErrors } from "./usage-errors.js";

/** The log level asked for: `--log-level`, else `TOOLMESH_LOG_LEVEL`; undefined when neither. */
export function chosenLogLevel(
  program: Command,
  env: Readonly<Record<string, string | undefined>>,
): string | undefined {
  return program.opts<{ logLevel?: string }>().logLevel ?? env.TOOLMESH_LOG_LEVEL;
}

interface GlobalOptions {
  server?: string;
  creds?: string;
  nkey?: string;
  user?: string;
  password?: string;
  token?: string;
  tlscert?: string;
  tlskey?: string;
  tlsca?: string;
  prefix?: string;
  tenant?: string;
  logLevel?: string;
  toolsDir?: string;
}

/**
 * The `toolmesh` command line. `env` is the process environment; `run` receives each
 * command's exit code.
 */
export function buildProgram(
  env: Readonly<Record<string, string | undefined>>,
  run: (command: () => Promise<number>) => void,
): Command {
  const program = new Command("toolmesh")
    .description("Executes LLM tool calls over NATS")
    .version(cliVersion(), "-V, --version", "print the version and exit")
    .option("-s, --server <url>", "NATS server URL(s) (NATS_URL)")
    .option("--creds <file>", "NATS credentials file (NATS_CREDS)")
    .option("--nkey <file>", "NATS nkey seed file (NATS_NKEY)")
    .option("--user <name>", "NATS user (NATS_USER)")
    .option("--password <secret>", "NATS password (NATS_PASSWORD)")
    .option("--token <secret>", "NATS token (NATS_TOKEN)")
    .option("--tlscert <file>", "TLS client certificate, PEM (NATS_CERT)")
    .option("--tlskey <file>", "private key of the TLS client certificate, PEM (NATS_KEY)")
    .option("--tlsca <file>", "CA bundle the server's certificate is checked against (NATS_CA)")
    .option("--prefix <prefix>", "subject prefix (TOOLMESH_PREFIX)")
    .option("--tenant <id>", "tenant id of this frontend (TOOLMESH_TENANT)")
    .option("--log-level <level>", "fatal|error|warn|info|debug|trace|silent (TOOLMESH_LOG_LEVEL)");

  const config = (extra: Partial<Record<string, string | undefined>> = {}): RuntimeConfig => {
    const o = program.opts<GlobalOptions>();
    return loadConfig(env, {
      NATS_URL: o.server,
      NATS_CREDS: o.creds,
      NATS_NKEY: o.nkey,
      NATS_USER: o.user,
      NATS_PASSWORD: o.password,
      NATS_TOKEN: o.token,
      NATS_CERT: o.tlscert,
      NATS_KEY: o.tlskey,
      NATS_CA: o.tlsca,
      TOOLMESH_PREFIX: o.prefix,
      TOOLMESH_TENANT: o.tenant,
      TOOLMESH_LOG_LEVEL: o.logLevel,
      ...extra,
    });
  };

  addActorCommands(program, env, config, run);
  addCallCommands(program, config, run);
  addToolsCommands(program, () => config(), run);
  addDlqCommands(program, () => config(), run);

  addCatalogCommands(program, () => config(), run);
  addSetupCommand(program, config, run);
  addQuotaCommands(program, () => config(), run);
  addPolicyCommands(program, () => config(), run);
  addApprovalCommands(program, () => config(), run);
  addSecretsCommands(program, () => config(), run);
  addAuditCommands(program, () => config(), run);
  addStatsCommand(program, () => config(), run);
  addTopCommand(program, () => config(), run);
  addWatchCommand(program, () => config(), run);
  addCancelCommand(program, () => config(), run);
  addAuthCommands(program, () => config(), run);

  addVersionEverywhere(program);
  oneLineUsageErrors(program);

  return program;
}

/** `toolmesh call` and `toolmesh resolve`: one call, run or only resolved. */
function addCallCommands(
  program: Command,
  config: () => RuntimeConfig,
  run: (command: () => Promise<number>) => void,
): void {
  const callOptions = (cmd: Command, timeout = "the call's budget in ms"): Command =>
    cmd
      .option("--args <json>", "function.arguments as JSON text", "{}")
      .option("--session <id>", "session id (default: a new one)")
      .addOption(new Option("--timeout-ms <n>", timeout).argParser(positiveInt))
      .option("--idempotency-key <key>", "runs once per key within the call retention")
      .option("--agent <name>", "the agent the call is made for (its tools and context)")
      .option("--context <json>", "call-level execution context, a JSON object")
      .option("--json", "print one JSON object");

  callOptions(
    program
      .command("call")
      .description(
        "publish one call, show its progress on stderr, print its final message (Ctrl-C cancels it)",
      )
      .argument("<tool>")
      .option("-q, --quiet", "no progress or notices on stderr"),
  ).action((tool: string, o: CallOptions) => {
    run(() => callCommand(config(), tool, o));
  });

  callOptions(
    program
      .command("resolve")
      .description("print the resolved-call record without executing")
      .argument("<tool>"),
    "the call's budget in ms, and how long to wait for the reply (default 5000)",
  ).action((tool: string, o: CallOptions) => {
    run(() => resolveCommand(config(), tool, o));
  });
}

/** `toolmesh tools`: the registry, MCP tool approvals and OpenAPI imports. */
function addToolsCommands(
  program: Command,
  config: () => RuntimeConfig,
  run: (command: () => Promise<number>) => void,
): void {
  const tools = program
    .command("tools")
    .description("look at the tool registry, approve MCP tools, import OpenAPI documents");
  tools
    .command("list")
    .description("name and summary of every registered tool")
    .option("--json", "print JSON, with groups and kind")
    .action((o: { json?: boolean }) => run(() => toolsListCommand(config(), o)));
  tools
    .command("show")
    .description("a tool's full registry entry (exit 1 for an unknown tool)")
    .argument("<tool>")
    .option("--json", "print JSON")
    .action((name: string, o: { json?: boolean }) =>
      run(() => toolsShowCommand(config(), name, o)),
    );
  addToolApprovalCommand(tools, config, run);
  addImportOpenApiCommand(tools, config, run);
}

/** `toolmesh dlq`: dead letters listed, shown, replayed and purged. */
function addDlqCommands(
  program: Command,
  config: () => RuntimeConfig,
  run: (command: () => Promise<number>) => void,
): void {
  const dlq = program
    .command("dlq")
    .description("look at dead letters and replay them once the cause is fixed");
  dlq
    .command("list")
    .description("list dead letters, oldest first")
    .option("--tool <name>", "only the letters of this tool")
    .addOption(
      new Option("--limit <n>", "most letters listed (default 100)").argParser(positiveInt),
    )
    .option("--json", "print JSON")
    .action((o: { tool?: string; limit?: number; json?: boolean }) =>
      run(() => dlqListCommand(config(), o)),
    );
  dlq
    .command("show")
    .description("print one dead letter with its body")
    .addArgument(
      program.createArgument("<seq>", "sequence in the DLQ stream").argParser(positiveInt),
    )
    .option("--json", "print JSON")
    .action((seq: number, o: { json?: boolean }) => run(() => dlqShowCommand(config(), seq, o)));
  dlq
    .command("replay")
    .description(
      "run a dead-lettered call again (its session gets a new final message) and delete the letter",
    )
    .addArgument(
      program.createArgument("<seq>", "sequence in the DLQ stream").argParser(positiveInt),
    )
    .option("--json", "print JSON")
    .action((seq: number, o: { json?: boolean }) => run(() => dlqReplayCommand(config(), seq, o)));
  dlq
    .command("purge")
    .description("remove the dead letters (of one tool) and give their space back")
    .option("--tool <name>", "only the letters of this tool")
    .option("--json", "print JSON")
    .action((o: { tool?: string; json?: boolean }) => run(() => dlqPurgeCommand(config(), o)));
}

/** `serve` and `dev`: the commands that run actors; their packages load when they run. */
function addActorCommands(
  program: Command,
  env: Readonly<Record<string, string | undefined>>,
  config: (extra?: Partial<Record<string, string | undefined>>) => RuntimeConfig,
  run: (command: () => Promise<number>) => void,
): void {
  program
    .command("serve")
    .description(`run one or more actors in this process (${ROLES.join(", ")})`)
    .addArgument(program.createArgument("<roles...>", "actors to run").choices(ROLES))
    .option("--tools-dir <dir>", "folder of builtin tool modules (TOOLMESH_TOOLS_DIR)")
    .option("--concurrency <n>", "calls run at once by this executor (TOOLMESH_CONCURRENCY)")
    .option("--port <port>", "port of the MCP gateway's /mcp (TOOLMESH_GATEWAY_PORT)")
    .action((roles: Role[], o: { toolsDir?: string; concurrency?: string; port?: string }) => {
      run(async () => {
        const c = config({ TOOLMESH_TOOLS_DIR: o.toolsDir, TOOLMESH_CONCURRENCY: o.concurrency });
        // Read before connecting: a gateway with no authentication refuses to start at once.
        const gateway = roles.includes("gateway")
          ? (await import("@toolmesh/gateway")).loadGatewayConfig(env, {
              TOOLMESH_GATEWAY_PORT: o.port,
            })
          : undefined;
        await serveActors(c, roles.join("+"), (rt) =>
          startActors(rt, roles, gateway === undefined ? {} : { gateway: () => gateway }),
        );
        return new Promise<number>(() => undefined);
      });
    });

  program
    .command("dev")
    .description("run every actor against NATS_URL, or a nats-server it starts, then a demo")
    .option("--tools-dir <dir>", "folder of builtin tool modules (TOOLMESH_TOOLS_DIR)")
    .option("--no-demo", "skip the demo")
    .option("--exit-after-demo", "stop the mesh once the demo is done (exit 1 if it went wrong)")
    .action((o: { toolsDir?: string; demo: boolean; exitAfterDemo?: boolean }) => {
      run(async () =>
        (await import("./dev.js")).devCommand(
          config({
            TOOLMESH_TOOLS_DIR: o.toolsDir,
            // The demo's output is the point of `dev`: quiet logs unless asked.
            TOOLMESH_LOG_LEVEL: chosenLogLevel(program, env) ?? "warn",
          }),
          { demo: o.demo, exitAfterDemo: o.exitAfterDemo === true, env },
        ),
      );
    });
}
