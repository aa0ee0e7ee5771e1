import type { Command, CommanderError } from "commander";

/** A command line commander could not parse: an unknown option, a missing argument, a bad value. */
export class UsageError extends Error {
  override readonly name = "UsageError";
}

/** Commander's ends that are not errors: the help or the version asked for and printed. */
const PRINTED = new Set(["commander.helpDisplayed", "commander.version", "commander.help"]);

/**
 * Makes a usage error of `command` and of every command under it one line — `unknown option
 * '--bogus' (see toolmesh call --help)` — thrown as a {@link UsageError} for the CLI's top level
 * to print, instead of commander's `error: …` and the whole help. The help and the version,
 * asked for or shown for a missing subcommand, still print; their {@link CommanderError} is
 * rethrown with its exit status. Call it once the tree of commands is complete.
 */
export function oneLineUsageErrors(command: Command, path = command.name()): void {
  command
    .showHelpAfterError(false)
    // Commander's own `error: …` text is replaced by the UsageError's line.
    .configureOutput({ outputError: () => undefined })
    .exitOverride((err) => {
      if (PRINTED.has(err.code)) throw err;
      throw new UsageError(`${usageMessage(err)} (see ${path} --help)`, { cause: err });
    });
  for (const sub of command.commands) oneLineUsageErrors(sub, `${path} ${sub.name()}`);
}

/** Commander's message without its `error: ` and with its suggestion on the same line. */
function usageMessage(err: CommanderError): string {
  return err.message
    .replace(/^error: /, "")
    .replace(/\s*\n\s*/g, " ")
    .trim();
}
