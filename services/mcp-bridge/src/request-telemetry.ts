import { ToolmeshError } from "@toolmesh/protocol";
import {
  ATTR_GEN_AI_TOOL_NAME,
  ATTR_MCP_METHOD_NAME,
  ATTR_TOOLMESH_MCP_SERVER,
  SpanKind,
  markOutcome,
  toolmeshMetrics,
  trace,
  traceContextFields,
  withSpan,
} from "@toolmesh/telemetry";

const METHOD = "tools/call";

/**
 * Sends one `tools/call` in a CLIENT span (`tools/call {tool}`, MCP semantic conventions) whose
 * trace context `send` puts in the request's `params._meta` (`traceparent`, `tracestate`), for
 * servers that continue the trace, and records the request's latency per server. A result
 * flagged `isError` counts as `tool_error`.
 */
export async function traceToolCall<T extends { isError?: boolean | undefined }>(
  server: string,
  tool: string,
  send: (traceMeta: Record<string, string>) => Promise<T>,
): Promise<T> {
  const started = performance.now();
  let code: string | undefined;
  try {
    return await withSpan(
      trace.getTracer("toolmesh-mcp-bridge"),
      `${METHOD} ${tool}`,
      {
        kind: SpanKind.CLIENT,
        attributes: {
          [ATTR_MCP_METHOD_NAME]: METHOD,
          [ATTR_GEN_AI_TOOL_NAME]: tool,
          [ATTR_TOOLMESH_MCP_SERVER]: server,
        },
      },
      async (span) => {
        const result = await send(traceContextFields());
        if (result.isError === true) {
          code = "tool_error";
          markOutcome(span, code);
        }
        return result;
      },
    );
  } catch (err) {
    code = err instanceof ToolmeshError ? err.code : "unavailable";
    throw err;
  } finally {
    toolmeshMetrics().mcpRequest(server, METHOD, (performance.now() - started) / 1000, code);
  }
}
