import { z } from "zod";

const Attributes = z.record(z.string(), z.union([z.string(), z.number(), z.boolean()]));

/** One data point of a metric in a {@link StatsReply}. */
export const MetricPointSchema = z
  .object({
    attributes: Attributes.describe("The point's labels (OpenTelemetry attributes)."),
    value: z.number().optional().describe("Counters, up-down counters and gauges."),
    histogram: z
      .object({
        boundaries: z.array(z.number()).describe("Upper bounds of the buckets but the last."),
        counts: z.array(z.number().int().nonnegative()).describe("One count per bucket."),
        sum: z.number(),
        count: z.number().int().nonnegative(),
      })
      .optional()
      .describe("Histograms: cumulative bucket counts since the process started."),
  })
  .meta({ id: "MetricPoint" });

/**
 * What one toolmesh process answers on `{p}.v1.control.stats`: its identity and every metric
 * it holds, the same numbers its `/metrics` endpoint shows, cumulative since it started.
 */
export const StatsReplySchema = z
  .object({
    service: z.string().describe("service.name (OTEL_SERVICE_NAME, else toolmesh-<roles>)."),
    instance: z.string().describe("host:pid of the process."),
    started_at: z.number().describe("Epoch ms at which the process started."),
    metrics: z.array(
      z.object({
        name: z.string().describe("OpenTelemetry instrument name, e.g. toolmesh.tool.calls."),
        unit: z.string(),
        type: z.enum(["counter", "updown", "gauge", "histogram"]),
        points: z.array(MetricPointSchema),
      }),
    ),
  })
  .meta({ id: "StatsReply", description: "One process's metrics, for toolmesh stats." });

/** One process's answer to a stats request. */
export type StatsReply = z.infer<typeof StatsReplySchema>;
