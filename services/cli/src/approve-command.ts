import type { Command } from "commander";
import { createSubjects } from "@toolmesh/protocol";
import type { RuntimeConfig } from "@toolmesh/runtime";
import { meshSettings } from "@toolmesh/runtime";
import { withConnection } from "./commands.js";
import { say, typedFailure } from "./print.js";

/**
 * Adds `tools approve <server> [tools...]` under the `tools` command. `config` builds the
 * configuration from the global options; `run` receives the exit code.
 */
export function addToolApprovalCommand(
  tools: Command,
  config: () => RuntimeConfig,
  run: (command: () => Promise<number>) => void,
): void {
  tools
    .command("approve")
    .description(
      "approve the new definitions of a pinned MCP server's tools, so the mcp-bridge serves them again",
    )
    .argument("<server>", "the MCP server's name")
    .argument("[tools...]", "its MCP tool names (default: every tool waiting for approval)")
    .option("--json", "print JSON")
    .action((server: string, names: string[], o: { json?: boolean }) =>
      run(() => approveToolsCommand(config(), server, names, o)),
    );
}

/**
 * `toolmesh tools approve`: moves the pending definitions of a pinned server's tools into its
 * approvals; every bridge serving the server registers them at once. Exit 1 when nothing named
 * waits for approval.
 */
export async function approveToolsCommand(
  config: RuntimeConfig,
  server: string,
  tools: readonly string[],
  options: { json?: boolean },
): Promise<number> {
  return withConnection(config, async (nc) => {
    // Loaded here, not with the CLI: only this command needs the bridge.
    const { ToolPins } = await import("@toolmesh/mcp-bridge");
    const pins = await ToolPins.open(
      nc,
      createSubjects({ prefix: config.prefix }),
      meshSettings(config),
    );
    try {
      const approved = await pins.approve(server, tools);
      if (options.json === true) {
        say(JSON.stringify({ server, approved }));
        return 0;
      }
      for (const a of approved) {
        const was =
          a.previous_sha256 === undefined ? "new" : `was ${a.previous_sha256.slice(0, 12)}`;
        const changed = a.fields.length === 0 ? "" : `; changed: ${a.fields.join(", ")}`;
        say(`approved ${server}.${a.tool} (sha256 ${a.sha256.slice(0, 12)}, ${was}${changed})`);
      }
      return 0;
    } catch (err) {
      return typedFailure(err, options.json);
    }
  });
}
