import type { Command } from "commander";
import type { NatsConnection } from "@nats-io/nats-core";
import type { Subjects } from "@toolmesh/protocol";
import { ErrorCode, ToolmeshError } from "@toolmesh/protocol";
import type { RuntimeConfig } from "@toolmesh/runtime";
import type { UserSecretStore } from "@toolmesh/tool-host";
import { asOperator } from "./commands.js";
import { say } from "./print.js";

interface SecretOptions {
  subject: string;
  tool?: string;
  json?: boolean;
}

/** Everything on stdin, one trailing newline dropped (what `echo` and here-strings add). */
async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks)
    .toString("utf8")
    .replace(/\r?\n$/, "");
}

function withSecrets(
  config: RuntimeConfig,
  json: boolean | undefined,
  fn: (store: UserSecretStore, nc: NatsConnection, subjects: Subjects) => Promise<number>,
): Promise<number> {
  return asOperator(config, json, async (nc, subjects) => {
    if (config.secretKeys === undefined)
      throw new ToolmeshError(
        ErrorCode.InvalidRequest,
        "set TOOLMESH_SECRET_KEYS to the keys the executors open users' secrets with",
      );
    const { SecretBox, UserSecretStore } = await import("@toolmesh/tool-host");
    const box = SecretBox.fromKeyList(config.secretKeys, "TOOLMESH_SECRET_KEYS");
    return fn(
      await UserSecretStore.open(nc, subjects, box, {
        create: true,
        replicas: config.streamReplicas,
      }),
      nc,
      subjects,
    );
  });
}

function tenantOf(program: Command, config: RuntimeConfig): string {
  return program.opts<{ tenant?: string }>().tenant ?? config.tenant;
}

/** `toolmesh secrets set|list|rm`: users' secrets for tools that act as their caller. */
export function addSecretsCommands(
  program: Command,
  config: () => RuntimeConfig,
  run: (command: () => Promise<number>) => void,
): void {
  const secrets = program
    .command("secrets")
    .description(
      "users' secrets for tools declaring credentials of type user-secret, sealed with TOOLMESH_SECRET_KEYS (docs/credentials.md)",
    );

  secrets
    .command("set")
    .description("store a user's secret for a tool, read from stdin (replaces the one stored)")
    .requiredOption(
      "--subject <subject>",
      "the user: the subject of their identity (--user is the NATS user)",
    )
    .requiredOption("--tool <name>", "the tool")
    .option("--json", "print JSON")
    .action((o: SecretOptions) =>
      run(() =>
        withSecrets(config(), o.json, async (store) => {
          const value = await readStdin();
          if (value === "") throw new ToolmeshError(ErrorCode.InvalidRequest, "no secret on stdin");
          await store.set(tenantOf(program, config()), o.subject, o.tool ?? "", value);
          say(o.json === true ? JSON.stringify({ stored: true }) : "stored");
          return 0;
        }),
      ),
    );

  secrets
    .command("list")
    .description("the tools a user stored a secret for (names only, never values)")
    .requiredOption("--subject <subject>", "the user: the subject of their identity")
    .option("--json", "print JSON")
    .action((o: SecretOptions) =>
      run(() =>
        withSecrets(config(), o.json, async (store) => {
          const tools = await store.list(tenantOf(program, config()), o.subject);
          say(o.json === true ? JSON.stringify({ tools }) : tools.join("\n"));
          return 0;
        }),
      ),
    );

  secrets
    .command("rm")
    .description("remove a user's secret for a tool")
    .requiredOption("--subject <subject>", "the user: the subject of their identity")
    .requiredOption("--tool <name>", "the tool")
    .option("--json", "print JSON")
    .action((o: SecretOptions) =>
      run(() =>
        withSecrets(config(), o.json, async (store) => {
          const removed = await store.remove(tenantOf(program, config()), o.subject, o.tool ?? "");
          say(
            o.json === true
              ? JSON.stringify({ removed })
              : removed
                ? "removed"
                : "toolmesh: no such secret",
          );
          return removed ? 0 : 1;
        }),
      ),
    );
}
