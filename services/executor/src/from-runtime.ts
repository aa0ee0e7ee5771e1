import { readFile } from "node:fs/promises";
import { parse as parseYaml } from "yaml";
import { z } from "zod";
import { Defaults, issuesLine } from "@toolmesh/protocol";
import type { Runtime } from "@toolmesh/runtime";
import { meshAuditTrail } from "@toolmesh/runtime";
import type { Executor } from "@toolmesh/tool-host";
import { credentialSources, startExecutor } from "@toolmesh/tool-host";
import { EXECUTOR_SOURCE_KINDS } from "./source-kinds.js";
import { loadToolSources } from "./tool-source.js";

const PresetsFileSchema = z.record(z.string(), z.record(z.string(), z.unknown()));

/** Reads a presets file (YAML or JSON): `{ <tool>: { <param>: <value> } }`. */
export async function loadPresetsFile(
  path: string,
): Promise<Record<string, Record<string, unknown>>> {
  const parsed = PresetsFileSchema.safeParse(parseYaml(await readFile(path, "utf8")));
  if (!parsed.success) {
    throw new Error(
      `presets file ${path} must map tool names to objects of param values: ${issuesLine(parsed.error)}`,
    );
  }
  return parsed.data;
}

/**
 * Starts an executor configured by the runtime: the tools of every source kind (builtin
 * modules, HTTP tool files, OpenAPI documents), presets file, concurrency.
 */
export async function startExecutorFromRuntime(rt: Runtime): Promise<Executor> {
  const { config } = rt;
  const log = rt.log.child({ actor: "executor" });
  const tools = await loadToolSources(
    EXECUTOR_SOURCE_KINDS,
    {
      toolsDir: config.toolsDir,
      nativeToolsDir: config.nativeToolsDir,
      nativeToolsDirOptional: config.nativeToolsDir === Defaults.nativeToolsDir,
      env: config.env,
      maxResponseBytes: config.maxMessageBytes,
      ...(config.nativeAllowedUrls === undefined ? {} : { allowedUrls: config.nativeAllowedUrls }),
      allowPrivateAddresses: config.allowPrivateAddresses,
      trustConfiguredHosts: config.trustConfiguredHosts,
    },
    log,
  );
  return startExecutor({
    nc: rt.nc,
    audit: await meshAuditTrail(rt, "executor"),
    subjects: rt.subjects,
    registry: rt.registry,
    ownerAccount: config.owner,
    tracer: rt.tracer,
    streamLimits: rt.streamLimits,
    log,
    tools: tools.map((t) => t.module),
    owner: config.executorOwner,
    concurrency: config.concurrency,
    ackWaitMs: config.ackWaitMs,
    callRetentionMs: config.callRetentionMs,
    maxResultBytes: config.maxResultBytes,
    consumerWaitMs: config.startupTimeoutMs,
    toolkitContext: config.toolkitContext,
    ...credentialSources(config),
    ...(config.presetsFile === undefined
      ? {}
      : { presets: await loadPresetsFile(config.presetsFile) }),
  });
}
