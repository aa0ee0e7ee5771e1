// Where the server messages of a call go: runs a mesh (resolver and executor processes) on a
// nats-server started with tracing (`-V`), makes `--calls` sequential `echo` calls, lets the
// last acknowledgements settle, and counts from the server's trace log every message each process sent
// (client → server) and received (server → client), by kind, per call. `npm run build` first.
// Usage: node bench/messages.mjs [--calls 200] [--settle-ms 5000]
import { mkdtempSync, readFileSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { benchFlags } from "./lib/flags.mjs";
import { setTimeout as delay } from "node:timers/promises";
import { startMesh } from "./lib/systems.mjs";

const { values: flags } = benchFlags({
  options: {
    calls: { type: "string", default: "200" },
    "settle-ms": { type: "string", default: "5000" },
  },
});
const calls = Number(flags.calls);
const dir = mkdtempSync(join(tmpdir(), "toolmesh-msgs-"));
const logFile = join(dir, "trace.log");
const mesh = await startMesh({ serverArgs: ["-V", "-l", logFile] });
let from;
try {
  for (let i = 0; i < 50; i++) await mesh.submit("echo", { text: "warm" });
  await delay(Number(flags["settle-ms"])); // let the warm-up settle
  from = statSync(logFile).size;
  for (let i = 0; i < calls; i++) await mesh.submit("echo", { text: "x".repeat(1024) });
  await delay(Number(flags["settle-ms"]));
} finally {
  await mesh.stop();
}

// Trace lines: `... - cid:N - "vX" - <<- [HPUB subject reply? hdr len]` (client → server), `->> [MSG ...]`.
const text = readFileSync(logFile, "utf8");
const names = new Map();
for (const m of text.matchAll(/cid:(\d+) - .*<<- \[CONNECT (\{.*\})\]/g)) {
  try {
    names.set(m[1], JSON.parse(m[2]).name ?? "driver");
  } catch {
    names.set(m[1], "?");
  }
}
const counts = new Map();
const add = (key) => counts.set(key, (counts.get(key) ?? 0) + 1);
const lines = text.slice(from).split("\n");
for (let i = 0; i < lines.length; i++) {
  const line = lines[i];
  const m = /cid:(\d+) - .*?(<<-|->>) \[(H?PUB|H?MSG) (\S+)/.exec(line);
  if (m === null) continue;
  const who = names.get(m[1]) ?? (m[1] ? "driver" : "?");
  const dirn = m[2] === "<<-" ? "in" : "out";
  const payload = /MSG_PAYLOAD: \["(.*)"\]/.exec(lines[i + 1] ?? "")?.[1] ?? "";
  add(`${dirn}\t${who}\t${kind(m[4], payload)}`);
}

function kind(subject, payload) {
  if (subject.startsWith("$JS.ACK.")) {
    const what = payload.startsWith("+ACK")
      ? "ack"
      : payload.startsWith("-NAK")
        ? "nak"
        : payload.startsWith("+WPI")
          ? "working"
          : payload.startsWith("+TERM")
            ? "term"
            : "ack?";
    return `${what} ${subject.split(".")[2]}/${subject.split(".")[3]}`;
  }
  if (subject.startsWith("$JS.API.CONSUMER.MSG.NEXT."))
    return `pull ${subject.split(".").slice(5, 7).join("/")}`;
  if (subject.startsWith("$JS.API.DIRECT.GET.")) return `direct get ${subject.split(".")[4]}`;
  if (subject.startsWith("$JS.API.")) return `api ${subject.split(".").slice(2, 4).join(".")}`;
  if (subject.startsWith("$KV.")) return `kv put ${subject.split(".")[1]}`;
  if (subject.startsWith("_INBOX.")) return "reply to an inbox";
  if (/^\$JS\.EVENT/.test(subject)) return "advisory";
  return subject.replace(/\.(default|bench-\d+|c\d+|echo|[A-Za-z0-9_-]{16,})(?=\.|$)/g, ".*");
}

const rows = [...counts.entries()].sort();
console.log(`per call, over ${calls} sequential echo calls (1 KB):\n`);
console.log("dir\tprocess\tmessage\tper call");
let totalIn = 0;
let totalOut = 0;
for (const [key, n] of rows) {
  console.log(`${key}\t${(n / calls).toFixed(2)}`);
  if (key.startsWith("in")) totalIn += n;
  else totalOut += n;
}
console.log(
  `\nclient → server: ${(totalIn / calls).toFixed(2)} per call; server → client: ${(totalOut / calls).toFixed(2)} per call`,
);
process.exit(0);
