import { buildProgram, chosenLogLevel } from "./program.js";
import { describeFailure, exitQuietlyOnClosedPipe } from "./failure.js";

exitQuietlyOnClosedPipe();
const program = buildProgram(process.env, (command) => {
  Promise.resolve()
    .then(command)
    .then(
      (c) => {
        process.exitCode = c;
        // Done: a telemetry exporter still waiting on a dead collector must not keep us here.
        setTimeout(() => process.exit(c), 250).unref();
      },
      (err: unknown) => {
        const o = program.opts<{ server?: string }>();
        const level = chosenLogLevel(program, process.env);
        const natsUrl = o.server ?? process.env.NATS_URL ?? "nats://127.0.0.1:4222";
        process.stderr.write(
          `toolmesh: ${describeFailure(err, natsUrl, level === "debug" || level === "trace")}\n`,
        );
        process.exit(2);
      },
    );
});
await program.parseAsync(process.argv);
