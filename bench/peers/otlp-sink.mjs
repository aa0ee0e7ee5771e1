// A local OTLP/HTTP receiver for the tracing-on variant: accepts every export, counts requests
// and bytes (printed on SIGTERM), keeps nothing. Its CPU is not counted as the mesh's.
import { createServer } from "node:http";

let requests = 0;
let bytes = 0;
const server = createServer((req, res) => {
  req.on("data", (chunk) => (bytes += chunk.length));
  req.on("end", () => {
    requests++;
    res.writeHead(200, { "content-type": "application/json" });
    res.end("{}");
  });
});
server.listen(0, "127.0.0.1", () => process.stdout.write(`ready ${server.address().port}\n`));
process.on("SIGTERM", () => {
  process.stdout.write(`${JSON.stringify({ requests, bytes })}\n`);
  server.close(() => process.exit(0));
});
