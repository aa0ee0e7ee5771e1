import { Server, createMcpHandler, PerRequestHTTPServerTransport, classifyInboundRequest } from "@modelcontextprotocol/server";
import { performance } from "node:perf_hooks";
const make = () => { const s = new Server({ name: "x", version: "1" }, { capabilities: { tools: { listChanged: true } } });
  s.setRequestHandler("tools/call", async () => ({ content: [{ type: "text", text: "ok" }] })); return s; };
const h = createMcpHandler(make, { legacy: "reject" });
const env = { "io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientInfo": { name: "b", version: "1" }, "io.modelcontextprotocol/clientCapabilities": {} };
const body = () => ({ jsonrpc: "2.0", id: 1, method: "tools/call", params: { name: "echo", arguments: { text: "x".repeat(1000) }, _meta: env } });
const headers = { "content-type": "application/json", accept: "application/json, text/event-stream", "mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": "echo" };
async function viaFetch() {
  const r = new Request("http://x/mcp", { method: "POST", headers });
  const res = await h.fetch(r, { parsedBody: body() }); await res.text();
}
async function viaTransport() {
  const b = body();
  const c = classifyInboundRequest({ httpMethod: "POST", protocolVersionHeader: "2026-07-28", mcpMethodHeader: "tools/call", mcpNameHeader: "echo", body: b });
  const t = new PerRequestHTTPServerTransport({ classification: { era: "modern", revision: "2026-07-28" }, responseMode: "json" });
  const s = make(); await s.connect(t);
  const res = await t.handleMessage(b); await res.text();
}
for (const [name, f] of [["fetch", viaFetch], ["transport", viaTransport], ["fetch", viaFetch], ["transport", viaTransport]]) {
  for (let i = 0; i < 300; i++) await f();
  const t0 = performance.now(); for (let i = 0; i < 3000; i++) await f();
  console.log(name, ((performance.now() - t0) * 1000 / 3000).toFixed(1), "µs");
}
process.exit(0);
