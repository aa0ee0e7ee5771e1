// Preloaded into a service by the memory benchmark (`node --expose-gc --import …`): on SIGUSR2 it
// collects garbage and writes the process's memory usage to `<TMP>/toolmesh-gc-probe-<pid>.json`,
// so retained memory can be told from heap the collector has not given back yet.
import { writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

process.on("SIGUSR2", () => {
  globalThis.gc();
  globalThis.gc();
  writeFileSync(
    join(tmpdir(), `toolmesh-gc-probe-${process.pid}.json`),
    JSON.stringify(process.memoryUsage()),
  );
});
