import type { Runtime } from "@toolmesh/runtime";
import { meshAuditTrail } from "@toolmesh/runtime";
import type { Bridge } from "./bridge.js";
import { startBridge } from "./bridge.js";
import { loadMcpServers } from "./config.js";
import { credentialSources } from "@toolmesh/tool-host";
import { observeBridge } from "./observe.js";

/**
 * Starts an mcp-bridge configured by the runtime: the server files of `TOOLMESH_MCP_DIR`
 * (default `tools/mcp`; a missing default folder means no servers), secrets from the
 * process environment, the executor limits of the runtime.
 */
export async function startBridgeFromRuntime(rt: Runtime): Promise<Bridge> {
  const { config } = rt;
  const log = rt.log.child({ actor: "mcp-bridge" });
  const servers = await loadMcpServers(config.mcpDir, { env: config.env });
  const bridge = await startBridge({
    nc: rt.nc,
    subjects: rt.subjects,
    registry: rt.registry,
    ownerAccount: config.owner,
    tracer: rt.tracer,
    streamLimits: rt.streamLimits,
    log,
    servers: servers.map((s) => s.config),
    env: config.env,
    concurrency: config.concurrency,
    ackWaitMs: config.ackWaitMs,
    callRetentionMs: config.callRetentionMs,
    maxResultBytes: config.maxResultBytes,
    audit: await meshAuditTrail(rt, "mcp-bridge"),
    allowPrivateAddresses: config.allowPrivateAddresses,
    trustConfiguredHosts: config.trustConfiguredHosts,
    ...credentialSources(config),
  });
  observeBridge(rt, bridge);
  return bridge;
}
