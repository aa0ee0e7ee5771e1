import { Writable } from "node:stream";
import { describe, expect, it } from "vitest";
import { Defaults } from "@toolmesh/protocol";
import { createLogger } from "@toolmesh/telemetry";
import { ConfigError, loadConfig } from "./config.js";
import { stopActor } from "./runtime.js";

/** A logger whose JSON lines are kept in `lines`. */
function capturedLog(): { log: ReturnType<typeof createLogger>; lines: Record<string, unknown>[] } {
  const lines: Record<string, unknown>[] = [];
  const destination = new Writable({
    write(chunk: Buffer, _encoding, done) {
      lines.push(JSON.parse(chunk.toString()) as Record<string, unknown>);
      done();
    },
  });
  return { log: createLogger({ service: "test", destination }), lines };
}

const timing = { shutdownGraceMs: 50, shutdownForceMs: 100 };

describe("stopActor", () => {
  it("closes the runtime and reports a clean stop when the actor stops in time", async () => {
    const { log, lines } = capturedLog();
    let closed = false;
    const rt = { log, close: async () => void (closed = true) };
    const clean = await stopActor(rt, { stop: async () => undefined }, timing);
    expect(clean).toBe(true);
    expect(closed).toBe(true);
    expect(lines.filter((l) => l.abandoned !== undefined)).toEqual([]);
  });

  it("gives up after the grace and force times, names what it abandons and closes anyway", async () => {
    const { log, lines } = capturedLog();
    let closed = false;
    const rt = { log, close: async () => void (closed = true) };
    const deaf = {
      stop: () => new Promise<void>(() => undefined),
      inFlight: () => ["default/s/k1", "default/s/k2"],
    };
    const began = Date.now();
    const clean = await stopActor(rt, deaf, timing);
    expect(clean).toBe(false);
    expect(Date.now() - began).toBeGreaterThanOrEqual(140);
    expect(closed).toBe(true);
    const line = lines.find((l) => l.abandoned !== undefined);
    expect(line).toMatchObject({ abandoned: 2, calls: ["default/s/k1", "default/s/k2"] });
  });

  it("does not wait for a close that hangs once it has given up", async () => {
    const { log } = capturedLog();
    const rt = { log, close: () => new Promise<void>(() => undefined) };
    const clean = await stopActor(rt, { stop: () => new Promise<void>(() => undefined) }, timing);
    expect(clean).toBe(false);
  });
});

describe("TOOLMESH_SHUTDOWN_FORCE_MS", () => {
  it("defaults to Defaults.shutdownForceMs and takes a positive number of ms", () => {
    expect(loadConfig({}).shutdownForceMs).toBe(Defaults.shutdownForceMs);
    expect(loadConfig({ TOOLMESH_SHUTDOWN_FORCE_MS: "750" }).shutdownForceMs).toBe(750);
  });

  it("refuses a value that is not a positive number, naming the variable", () => {
    expect(() => loadConfig({ TOOLMESH_SHUTDOWN_FORCE_MS: "0" })).toThrow(ConfigError);
    expect(() => loadConfig({ TOOLMESH_SHUTDOWN_FORCE_MS: "soon" })).toThrow(
      /TOOLMESH_SHUTDOWN_FORCE_MS/,
    );
  });
});
