import { CommanderError } from "commander";
import { buildProgram, chosenLogLevel } from "./program.js";
import { describeFailure, exitQuietlyOnClosedPipe } from "./failure.js";

/** Prints a failed command's one line (its stack only when debugging) and exits 2. */
function fail(err: unknown): never {
  const o = program.opts<{ server?: string }>();
  const level = chosenLogLevel(program, process.env);
  const natsUrl = o.server ?? process.env.NATS_URL ?? "nats://127.0.0.1:4222";
  process.stderr.write(
    `toolmesh: ${describeFailure(err, natsUrl, level === "debug" || level === "trace")}\n`,
  );
  process.exit(2);
}

exitQuietlyOnClosedPipe();
const program = buildProgram(process.env, (command) => {
  Promise.resolve()
    .then(command)
    .then((c) => {
      process.exitCode = c;
      // Done: a telemetry exporter still waiting on a dead collector must not keep us here.
      setTimeout(() => process.exit(c), 250).unref();
    }, fail);
});
try {
  await program.parseAsync(process.argv);
} catch (err) {
  // The help or the version, printed: 0 when asked for, 2 when shown for a missing subcommand.
  if (err instanceof CommanderError) process.exit(err.exitCode === 0 ? 0 : 2);
  fail(err);
}
