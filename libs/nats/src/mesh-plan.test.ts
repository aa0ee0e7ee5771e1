import { createSubjects } from "@toolmesh/protocol";
import { describe, expect, it } from "vitest";
import { meshPlan, tenantIntakeSpec } from "./mesh-plan.js";
import { tenantCallsStreamSpec } from "./streams.js";

describe("meshPlan", () => {
  const subjects = createSubjects({ prefix: "acme.prod" });

  it("gives every stream and bucket the configured replica count, naming the variable", () => {
    const plan = meshPlan(subjects, { replicas: 3 });
    const all = [...plan.streams, ...Object.values(plan.buckets)];
    expect(all).toHaveLength(16);
    for (const spec of all) {
      expect(spec.config.num_replicas).toBe(3);
      expect(spec.settings.num_replicas).toBe("TOOLMESH_STREAM_REPLICAS");
    }
  });

  it("defaults to one replica and puts buckets on their KV_ streams", () => {
    const plan = meshPlan(subjects);
    expect(plan.streams.map((s) => s.config.num_replicas)).toEqual(plan.streams.map(() => 1));
    expect(plan.buckets.calls.config.name).toBe("KV_acme_prod_calls");
    expect(plan.buckets.calls.config.subjects).toEqual(["$KV.acme_prod_calls.>"]);
  });

  it("sets the bucket TTLs and the consumers' ack wait from the settings, in nanoseconds", () => {
    const plan = meshPlan(subjects, {
      callRetentionMs: 3_600_000,
      sessionStateTtlMs: 60_000,
      ackWaitMs: 2_000,
    });
    expect(plan.buckets.calls.config.max_age).toBe(3_600_000 * 1e6);
    expect(plan.buckets.calls.settings.max_age).toBe("TOOLMESH_CALL_RETENTION_MS");
    expect(plan.buckets.sessions.config.max_age).toBe(60_000 * 1e6);
    expect(plan.buckets.registry.config.max_age).toBe(0);
    expect(plan.consumers.resolver.config.ack_wait).toBe(2_000 * 1e6);
    expect(plan.consumers.schemaExpander.config.filter_subject).toBe(subjects.allMissingArguments);
    expect(plan.consumers.deadLetters.config.max_deliver).toBe(-1);
    // Deadlines are kept by watching the work stream, with no stream or consumer of their own.
    expect(Object.keys(plan.consumers)).not.toContain("deadlines");
    expect(plan.streams.map((s) => s.config.name)).not.toContain("ACME_PROD_TIMERS");
  });

  it("gives a tenant a calls stream bounded per tenant and per session, read by a push consumer of the resolvers' group", () => {
    const stream = tenantCallsStreamSpec(subjects, "globex", {
      maxQueuedCallsPerTenant: 500,
      maxQueuedCallsPerSession: 50,
      replicas: 3,
    });
    expect(stream.name).toBe("ACME_PROD_CALLS_globex");
    expect(stream.config).toMatchObject({
      subjects: ["acme.prod.v1.tenant-calls.globex.*"],
      retention: "workqueue",
      discard: "new",
      max_msgs: 500,
      max_msgs_per_subject: 50,
      discard_new_per_subject: true,
      num_replicas: 3,
    });
    expect(stream.settings.max_msgs).toBe("TOOLMESH_MAX_QUEUED_CALLS_PER_TENANT");
    const intake = tenantIntakeSpec(subjects, "globex", { ackWaitMs: 2_000 });
    expect(intake.stream).toBe("ACME_PROD_CALLS_globex");
    expect(intake.config).toMatchObject({
      durable_name: "resolver",
      deliver_subject: "acme.prod.v1.intake",
      deliver_group: "resolver",
      ack_wait: 2_000 * 1e6,
    });
    expect(subjects.isCallsStream("ACME_PROD_CALLS_globex")).toBe(true);
    expect(subjects.isCallsStream("ACME_PROD_WORK")).toBe(false);
    // The advisories stream adds every tenant's calls stream's max-deliveries advisories.
    const advisories = meshPlan(subjects).streams.find((s) => s.addsSubjects === true);
    expect(advisories?.addsSubjectsFor?.map((of) => of.streams)).toContain(
      "acme.prod.v1.tenant-calls.*.*",
    );
  });
});
