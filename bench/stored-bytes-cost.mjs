// What counting a tenant's stored results costs (ADR 0050): `node bench/stored-bytes-cost.mjs`
// (after `npm run build`). Against a local nats-server, one resolver's ledger writes the stored
// bytes of 1, 100 and 1 000 tenants (one compare-and-set of each tenant's entry in
// `{p}_quota_usage`), then times admission's check. Prints the figures as JSON on stdout.
import { performance } from "node:perf_hooks";
import { connect } from "@nats-io/transport-node";
import { Kvm } from "@nats-io/kv";
import { startNatsServer } from "@toolmesh/nats-launcher";
import { createSubjects } from "@toolmesh/protocol";
import { QuotaGate, StoredBytes } from "@toolmesh/resolver";
import { createLogger } from "@toolmesh/telemetry";

const server = await startNatsServer();
const nc = await connect({ servers: server.url, noAsyncTraces: true });
const subjects = createSubjects();
const log = createLogger({ service: "bench", level: "warn", destination: process.stderr });
// Creates the quota buckets, as a resolver does.
const gate = await QuotaGate.open(nc, { subjects, log, reconcileMs: 0 });
const ledger = await StoredBytes.open({
  nc,
  subjects,
  usage: await new Kvm(nc).open(subjects.quotaUsageBucket),
  boundOf: () => undefined,
  defaultBound: 64 * 1024 ** 2,
  windowMs: 86_400_000,
  // Written only when asked, so each write is timed alone.
  flushMs: 3_600_000,
  now: Date.now,
  log,
});
const result = { writes: [], entry_bytes: 0, check_ns: 0 };
try {
  for (const tenants of [1, 100, 1_000]) {
    for (let i = 0; i < tenants; i++) ledger.add(`t${i}`, 500_000);
    const started = performance.now();
    await ledger.flush();
    const ms = performance.now() - started;
    result.writes.push({
      tenants,
      ms: Math.round(ms),
      us_per_tenant: Math.round((ms * 1000) / tenants),
    });
  }
  const usage = await new Kvm(nc).open(subjects.quotaUsageBucket);
  result.entry_bytes = (await usage.get("t0.stored"))?.value.length ?? 0;
  const checks = 1_000_000;
  const started = performance.now();
  for (let i = 0; i < checks; i++) ledger.refusal(`t${i % 1_000}`);
  result.check_ns = Math.round(((performance.now() - started) * 1e6) / checks);
} finally {
  await ledger.close();
  gate.close();
  await nc.close();
  await server.stop();
}
process.stdout.write(`${JSON.stringify(result)}\n`);
