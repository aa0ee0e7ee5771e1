import { ConfigError, StartupTimeoutError } from "@toolmesh/runtime";
import { ToolmeshError } from "@toolmesh/protocol";
import { ProvisionError } from "@toolmesh/nats";
import { buildProgram } from "./program.js";

const program = buildProgram(process.env, (command) => {
  Promise.resolve()
    .then(command)
    .then(
      (c) => {
        process.exitCode = c;
      },
      (err: unknown) => {
        const known =
          err instanceof ConfigError ||
          err instanceof ToolmeshError ||
          err instanceof ProvisionError ||
          err instanceof StartupTimeoutError;
        process.stderr.write(
          `toolmesh: ${known ? (err as Error).message : String((err as Error)?.stack ?? err)}\n`,
        );
        process.exit(2);
      },
    );
});
await program.parseAsync(process.argv);
