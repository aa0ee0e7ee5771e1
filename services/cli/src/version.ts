import { packageVersion } from "@toolmesh/runtime";
import type { Command } from "commander";

/** The CLI's version, from its package.json (beside `src/` and `dist/`). */
export function cliVersion(): string {
  return packageVersion(new URL("../package.json", import.meta.url));
}

/** Gives `command` and every command under it a `--version` option (`-V` on the root only). */
export function addVersionEverywhere(command: Command, version = cliVersion()): void {
  for (const sub of command.commands) {
    sub.version(version, "--version", "print the version and exit");
    addVersionEverywhere(sub, version);
  }
}
