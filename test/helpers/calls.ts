import type { MeshCallPlane } from "@toolmesh/call-store";
import { deadlineHeaders } from "@toolmesh/control-plane";
import { publishDurable } from "@toolmesh/nats";
import type { ResolvedCall, SessionAddress, Subjects } from "@toolmesh/protocol";
import { callKey } from "@toolmesh/protocol";

/** What a test says about a resolved call; the rest is filled in as the resolver would. */
export interface ResolvedCallSpec {
  id: string;
  tool: string;
  address: SessionAddress;
  /** Epoch ms the call was resolved at (the server's clock in the mesh). Default now. */
  now?: number;
  /** Default 60 000. */
  timeoutMs?: number;
  arguments?: Record<string, unknown>;
}

/** A resolved call in session `s`, its idempotency key `s/{id}`, as a resolver routes it. */
export function resolvedCall(spec: ResolvedCallSpec): ResolvedCall {
  const now = spec.now ?? Date.now();
  const timeoutMs = spec.timeoutMs ?? 60_000;
  return {
    call_id: spec.id,
    tool_call_id: spec.id,
    idempotency_key: `s/${spec.id}`,
    session_id: "s",
    address: spec.address,
    tool: spec.tool,
    arguments: spec.arguments ?? {},
    missing_required: [],
    missing_optional: [],
    input_parameters: [],
    context: {},
    agent_context: {},
    timeout_ms: timeoutMs,
    deadline_at: now + timeoutMs,
    resolved_at: now,
    tool_revision: 1,
  };
}

/**
 * Records call `c` and publishes its work as the resolver does (record accepted, work under
 * the call key with its deadline headers); resolves with the work message's sequence.
 */
export async function routeAsResolver(
  plane: MeshCallPlane,
  subjects: Subjects,
  c: ResolvedCall,
): Promise<number> {
  await plane.store.accept({
    idempotency_key: c.idempotency_key,
    call_id: c.call_id,
    session_id: c.session_id,
    address: c.address,
    tool: c.tool,
    args_hash: "h",
    state: "accepted",
    deadline_at: c.deadline_at,
  });
  const ack = await publishDurable(plane.js, subjects.work(c.tool), c, {
    msgId: callKey(c.address, c.idempotency_key),
    headers: deadlineHeaders(c),
  });
  return ack.seq;
}
