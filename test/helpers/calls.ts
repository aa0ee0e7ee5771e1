import type { ResolvedCall, SessionAddress } from "@toolmesh/protocol";

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
