import { ToolmeshClient } from "@toolmesh/client";
import { connectNats } from "@toolmesh/nats";
import { createSubjects } from "@toolmesh/protocol";

// Answers arrive below the tenant's own inbox prefix, the one its NATS user may read.
const nc = await connectNats({
  servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222",
  inboxPrefix: createSubjects().frontendInboxPrefix("acme"),
});
const client = new ToolmeshClient(nc, { tenant: "acme", defaultTimeoutMs: 30_000 });
const session = client.session("conversation-42");

// Every event of the session: results, progress and schemas.
const stopListening = session.onEvent((event) => {
  if (event.type === "progress") console.log("progress", event.event.data);
});

// One call. `result` never rejects: a failure is a tool message with `error` set.
const handle = session.submit(
  { name: "optimize_structure", arguments: { input_structure: "Cu.cif", model_path: "dpa.pt" } },
  { timeoutMs: 10_000, context: { units: "metric" } },
);
const message = await handle.result;
console.log(message.error ? `${message.error.code}: ${message.error.message}` : message.content);

// Cancel a call: a queued call never starts, a running one is aborted, and its `result` settles
// with a `cancelled` message — unless it had ended already (`{ cancelled: false, state: "done" }`).
// `pending`: the mesh had not accepted it yet; it is answered `cancelled` when it arrives.
const next = session.submit({
  name: "optimize_structure",
  arguments: { input_structure: "Fe.cif", model_path: "dpa.pt" },
});
const { cancelled, state } = await next.cancel(); // "cancelled", "pending", "done", "unknown"
console.log(cancelled, state, (await next.result).error?.code ?? "finished first");

// A model's whole tool_calls array, run in parallel. Call ids must be new to the session.
const batch = session.submitAll([
  { id: "call_1", type: "function", function: { name: "echo", arguments: '{"text":"a"}' } },
  { id: "call_2", type: "function", function: { name: "get_weather", arguments: '{"days":2}' } },
]);
for await (const m of batch.settled) console.log(m.tool_call_id, m.error?.code ?? m.content);

// Dry run: the resolved call (defaults filled, input_parameters), nothing executed.
const reply = await client.resolve(session.id, { name: "echo", arguments: { text: "hi" } });
if (reply.ok) console.log(reply.resolved.arguments);
else console.log(reply.error.code);

stopListening();
session.close();
await nc.drain();
