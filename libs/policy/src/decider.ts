import type { Context, EntityJson } from "@cedar-policy/cedar-wasm/nodejs";
import type { ToolDefinition } from "@toolmesh/protocol";
import { ErrorCode, ToolmeshError, ensureError } from "@toolmesh/protocol";
import type { ApprovalRule, CompiledPolicySet, SetVerdict } from "./policy-set.js";
import type { PolicyAction } from "./schema.js";
import { actionUid, cedarValue, tenantUid, toolEntity, toolUid } from "./schema.js";

/** Who asks for what: the facts a decision is made from. */
export interface PolicyRequest {
  /** The tenant (its subject token, the same as its id for plain names). */
  tenant: string;
  tool: ToolDefinition;
  /** The validated arguments (defaults filled, system parameters absent); unknown for a catalog. */
  args?: Record<string, unknown> | undefined;
  agent?: string | undefined;
  /** The credential's subject, from the gateway. */
  subject?: string | undefined;
  session?: string | undefined;
}

/** What a call decision reads of a resolved call. */
export interface ResolvedCallFacts {
  address: { tenant: string; session: string };
  arguments: Record<string, unknown>;
  agent?: string | undefined;
  /** Who the call acts for, verified where it entered the mesh: `context.subject`. */
  identity?: { subject: string } | undefined;
}

/** A decision and what made it; recorded with the call. */
export interface PolicyDecision {
  allowed: boolean;
  /** Ids of the policies that made it, each as `operator:<id>` or `tenant:<id>`. */
  policies: string[];
  /** The versions of the sets it was made with: `operator@<revision>`, `tenant@<revision>`. */
  version: string;
  /**
   * Set when an allowing permit is annotated `@approval`: the call waits for a person. With
   * several, the operator's approval wins over the caller's and the shortest wait counts.
   */
  approval?: (ApprovalRule & { policies: string[] }) | undefined;
}

/** A policy set in force and its version (the KV revision it was stored at). */
export interface PolicyScope {
  set: CompiledPolicySet;
  revision: number;
}

const UNKNOWN_ARGS = { __extn: { fn: "unknown", arg: "args" } };
const UNKNOWN_SESSION = { __extn: { fn: "unknown", arg: "session" } };
/** Catalog answers remembered per tenant, tool, agent and subject before the cache starts over. */
const MAX_CACHED = 20_000;

/**
 * Decides calls and catalogs against the operator's set and each tenant's set. Allowed means
 * allowed by both: a tenant's set can only narrow what the operator's permits. With no set at
 * all nothing is decided (every tool open, as before policies). Answers from memory: Cedar's
 * partial evaluation, with arguments and session unknown, is cached per tenant, tool, agent
 * and subject, and only a decision that depends on the arguments is evaluated per call.
 */
export class PolicyDecider {
  #operator: PolicyScope | undefined;
  readonly #tenants = new Map<string, PolicyScope>();
  readonly #entities = new WeakMap<ToolDefinition, EntityJson[]>();
  #cache = new Map<string, { tool: ToolDefinition; decision: PolicyDecision | undefined }>();
  /** Call decisions waiting for the end of this turn (see {@link decideCallSoon}). */
  #soon: (() => void)[] = [];

  /** Whether any set is in force. */
  get active(): boolean {
    return this.#operator !== undefined || this.#tenants.size > 0;
  }

  /** Puts the operator's set in force, or none. */
  setOperator(scope: PolicyScope | undefined): void {
    this.#operator = scope;
    this.#cache = new Map();
  }

  /** Puts a tenant's set in force, or none. */
  setTenant(tenant: string, scope: PolicyScope | undefined): void {
    if (scope === undefined) this.#tenants.delete(tenant);
    else this.#tenants.set(tenant, scope);
    this.#cache = new Map();
  }

  /** The set in force for the operator, or for a tenant. */
  scope(tenant?: string): PolicyScope | undefined {
    return tenant === undefined ? this.#operator : this.#tenants.get(tenant);
  }

  /** Whether `action` on the tool is allowed; undefined when no set is in force. */
  decide(action: PolicyAction, request: PolicyRequest): PolicyDecision | undefined {
    if (!this.active) return undefined;
    const known = this.#known(action, request);
    if (known !== undefined) return known;
    const shapeKey = this.#shapeKey(action, request);
    const shape = () => this.#request(action, request, true);
    const full = this.#request(action, request, false);
    return this.#combine(request.tenant, (set) => set.authorizeFor(shapeKey, shape, full));
  }

  /**
   * Decides a resolved call of `definition` (its arguments without system parameters, its
   * tenant, session, agent and verified subject); undefined when no set is in force. A tool gone from the
   * registry meanwhile is refused.
   */
  decideCall(
    call: ResolvedCallFacts,
    definition: ToolDefinition | undefined,
  ): PolicyDecision | undefined {
    if (!this.active) return undefined;
    if (definition === undefined) return this.#unknownTool(call);
    return this.decide("call", callRequest(call, definition));
  }

  /**
   * {@link decideCall}, for a decision that depends on the arguments made at the end of this turn
   * of the event loop together with the other calls that arrived in it: Cedar's code then runs
   * warm for all of them, not cold between messages, where it costs about three times as much
   * (ADR 0058). A decision known without the arguments is answered at once.
   */
  decideCallSoon(
    call: ResolvedCallFacts,
    definition: ToolDefinition | undefined,
  ): Promise<PolicyDecision | undefined> {
    if (!this.active) return Promise.resolve(undefined);
    if (definition === undefined) return Promise.resolve(this.#unknownTool(call));
    const request = callRequest(call, definition);
    const known = this.#known("call", request);
    if (known !== undefined) return Promise.resolve(known);
    return new Promise((resolve, reject) => {
      this.#soon.push(() => {
        try {
          resolve(this.decide("call", request));
        } catch (err) {
          reject(ensureError(err));
        }
      });
      if (this.#soon.length === 1) setImmediate(() => this.#decideSoon());
    });
  }

  #decideSoon(): void {
    const waiting = this.#soon;
    this.#soon = [];
    for (const decide of waiting) decide();
  }

  /** A call of a tool gone from the registry meanwhile: refused. */
  #unknownTool(call: ResolvedCallFacts): PolicyDecision {
    return { allowed: false, policies: [], version: this.#version(call.address.tenant) };
  }

  /**
   * The call decision whatever the arguments are, or `"depends"` when it depends on them;
   * undefined when no set is in force. What `toolmesh policy replay` compares.
   */
  decideWithoutArgs(request: Omit<PolicyRequest, "args">): PolicyDecision | "depends" | undefined {
    if (!this.active) return undefined;
    return this.#known("call", request) ?? "depends";
  }

  /**
   * Whether a catalog shows the tool: `list` is allowed and `call` is, for some arguments.
   * A principal is never shown a tool it may never call.
   */
  mayList(request: Omit<PolicyRequest, "args">): boolean {
    return this.listDecision(request)?.allowed ?? true;
  }

  /**
   * The decision behind {@link mayList}; undefined when no set is in force. Arguments are
   * unknown: a call decision that depends on them counts as possibly allowed.
   */
  listDecision(request: Omit<PolicyRequest, "args">): PolicyDecision | undefined {
    if (!this.active) return undefined;
    const list = this.#known("list", request);
    if (list !== undefined && !list.allowed) return list;
    const call = this.#known("call", request);
    if (call !== undefined && !call.allowed) return call;
    return list ?? call ?? { allowed: true, policies: [], version: this.#version(request.tenant) };
  }

  /**
   * The `permission_denied` a catalog entry, a schema or a call gets for a tool {@link mayList}
   * hides, or undefined: the resolver and the schema expander check it before anything else
   * about the tool, so a hidden tool's schema never reaches a caller.
   */
  listRefusal(request: Omit<PolicyRequest, "args">): ToolmeshError | undefined {
    const decision = this.listDecision(request);
    return decision === undefined || decision.allowed
      ? undefined
      : PolicyDecider.refusal(decision, request.tool.name, "list");
  }

  /** The `permission_denied` a refused call gets: the decision, never the policy text. */
  static refusal(
    decision: PolicyDecision,
    tool: string,
    action: PolicyAction = "call",
  ): ToolmeshError {
    const by =
      decision.policies.length === 0
        ? "no policy permits it"
        : `refused by policy ${decision.policies.map((p) => `"${p}"`).join(", ")}`;
    return new ToolmeshError(
      ErrorCode.PermissionDenied,
      action === "call"
        ? `call of tool "${tool}" is not allowed: ${by}`
        : `tool "${tool}" is not available to this caller: ${by}`,
      {
        details: { tool, policies: decision.policies, policy_version: decision.version },
      },
    );
  }

  // The decision with arguments and session unknown, when it does not depend on them.
  #known(action: PolicyAction, request: Omit<PolicyRequest, "args">): PolicyDecision | undefined {
    const key = this.#shapeKey(action, request);
    const cached = this.#cache.get(key);
    if (cached !== undefined && cached.tool === request.tool) return cached.decision;
    const { definite, ...partial } = this.#partial(action, request);
    const decision = definite ? partial : undefined;
    if (this.#cache.size >= MAX_CACHED) this.#cache = new Map();
    this.#cache.set(key, { tool: request.tool, decision });
    return decision;
  }

  #shapeKey(action: PolicyAction, request: Omit<PolicyRequest, "args">): string {
    return `${action}\u0000${request.tenant}\u0000${request.tool.name}\u0000${request.agent ?? "\u0001"}\u0000${request.subject ?? "\u0001"}\u0000${request.session === undefined ? 0 : 1}`;
  }

  #partial(
    action: PolicyAction,
    request: Omit<PolicyRequest, "args">,
  ): PolicyDecision & { definite: boolean } {
    let definite = true;
    const decision = this.#combine(request.tenant, (set) => {
      const verdict = set.authorizePartial(this.#request(action, request, true));
      if (verdict.decision === undefined) {
        definite = false;
        // Possibly allowed: a catalog shows it, a call is decided with its arguments.
        return { decision: "allow", policies: verdict.policies };
      }
      return verdict;
    });
    // Undecided scopes count as allowing: a refusal came from a scope that refuses whatever
    // the unknowns are.
    return { ...decision, definite: definite || !decision.allowed };
  }

  #version(tenant: string): string {
    const versions: string[] = [];
    if (this.#operator !== undefined) versions.push(`operator@${this.#operator.revision}`);
    const own = this.#tenants.get(tenant);
    if (own !== undefined) versions.push(`tenant@${own.revision}`);
    return versions.join(",");
  }

  #combine(tenant: string, evaluate: (set: CompiledPolicySet) => SetVerdict): PolicyDecision {
    const scopes: [string, PolicyScope | undefined][] = [
      ["operator", this.#operator],
      ["tenant", this.#tenants.get(tenant)],
    ];
    const policies: string[] = [];
    const versions: string[] = [];
    let approval: PolicyDecision["approval"];
    for (const [name, scope] of scopes) {
      if (scope === undefined) continue;
      versions.push(`${name}@${scope.revision}`);
      const verdict = evaluate(scope.set);
      const ids = verdict.policies.map((id) => `${name}:${id}`);
      if (verdict.decision !== "allow")
        return { allowed: false, policies: ids, version: versions.join(",") };
      policies.push(...ids);
      for (const id of verdict.policies) {
        const rule = scope.set.approvals.get(id);
        if (rule !== undefined) approval = strictest(approval, rule, `${name}:${id}`);
      }
    }
    return {
      allowed: true,
      policies,
      version: versions.join(","),
      ...(approval === undefined ? {} : { approval }),
    };
  }

  #request(action: PolicyAction, request: PolicyRequest, partial: boolean) {
    let entities = this.#entities.get(request.tool);
    if (entities === undefined) {
      entities = [toolEntity(request.tool)];
      this.#entities.set(request.tool, entities);
    }
    const context: Context = {
      args: partial ? UNKNOWN_ARGS : (cedarValue(request.args) ?? {}),
      ...(request.agent === undefined ? {} : { agent: request.agent }),
      ...(request.subject === undefined ? {} : { subject: request.subject }),
      ...(request.session === undefined
        ? {}
        : { session: partial ? UNKNOWN_SESSION : request.session }),
    };
    return {
      principal: tenantUid(request.tenant),
      action: actionUid(action),
      resource: toolUid(request.tool.name),
      context,
      entities,
    };
  }
}

/** What a call decision is made from: the call's facts, its arguments without system parameters. */
function callRequest(call: ResolvedCallFacts, definition: ToolDefinition): PolicyRequest {
  const system = definition.system_params;
  const args = system.some((p) => p in call.arguments)
    ? Object.fromEntries(Object.entries(call.arguments).filter(([k]) => !system.includes(k)))
    : call.arguments;
  return {
    tenant: call.address.tenant,
    tool: definition,
    args,
    agent: call.agent,
    subject: call.identity?.subject,
    session: call.address.session,
  };
}

/** The stricter of two approval rules: the operator's over the caller's, the shorter wait. */
function strictest(
  current: PolicyDecision["approval"],
  rule: ApprovalRule,
  id: string,
): NonNullable<PolicyDecision["approval"]> {
  if (current === undefined) return { ...rule, policies: [id] };
  const mode = current.mode === "operator" || rule.mode === "operator" ? "operator" : "caller";
  return { mode, ttlMs: Math.min(current.ttlMs, rule.ttlMs), policies: [...current.policies, id] };
}
