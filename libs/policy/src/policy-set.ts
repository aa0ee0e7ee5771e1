import { createHash } from "node:crypto";
import * as cedar from "@cedar-policy/cedar-wasm/nodejs";
import type {
  Context,
  DetailedError,
  EntityJson,
  PolicyJson,
  EntityUidJson,
  ResidualResponse,
} from "@cedar-policy/cedar-wasm/nodejs";
import { ErrorCode, ToolmeshError } from "@toolmesh/protocol";
import { CEDAR_SCHEMA } from "./schema.js";

/** One thing wrong with a policy set, where it is (1-based line and column). */
export interface PolicyProblem {
  line: number;
  column: number;
  message: string;
}

/** A policy set that does not parse or does not validate against the schema; nothing was changed. */
export class PolicySetError extends ToolmeshError {
  readonly problems: readonly PolicyProblem[];

  constructor(problems: PolicyProblem[]) {
    const first = problems[0];
    super(
      ErrorCode.InvalidRequest,
      first === undefined
        ? "invalid policy set"
        : `invalid policy set: line ${first.line}, column ${first.column}: ${first.message}`,
      { details: { problems } },
    );
    this.problems = problems;
  }
}

/** What a permit annotated `@approval` asks for: who decides, and for how long the call waits. */
export interface ApprovalRule {
  mode: "operator" | "caller";
  /** How long the call waits for a decision, in ms (`@approval_ttl`, default 24 h). */
  ttlMs: number;
}

/** How long a call waits for approval when its permit sets no `@approval_ttl`: 24 h, in ms. */
export const DEFAULT_APPROVAL_TTL_MS = 24 * 60 * 60 * 1000;

const DURATION_UNITS: Readonly<Record<string, number>> = {
  ms: 1,
  s: 1000,
  m: 60_000,
  h: 3_600_000,
  d: 86_400_000,
};

/**
 * An `@approval_ttl` value in ms: a whole number and a unit (`90s`, `30m`, `24h`, `7d`), or
 * undefined when it is not one. Five units, no arithmetic: nothing a library must parse.
 */
export function approvalTtlMs(text: string): number | undefined {
  const match = /^([1-9][0-9]{0,8})(ms|s|m|h|d)$/.exec(text.trim());
  if (match === null) return undefined;
  return Number(match[1]) * (DURATION_UNITS[match[2] ?? ""] ?? 0);
}

/** The approval rule of a policy's annotations, or why they are wrong. */
function approvalRuleOf(
  id: string,
  effect: string,
  annotations: Record<string, string>,
): ApprovalRule | string | undefined {
  const mode = annotations.approval;
  const ttl = annotations.approval_ttl;
  if (mode === undefined)
    return ttl === undefined ? undefined : `policy "${id}": @approval_ttl needs @approval`;
  if (effect !== "permit") return `policy "${id}": @approval is for permit policies`;
  if (mode !== "operator" && mode !== "caller")
    return `policy "${id}": @approval must be "operator" or "caller", not "${mode}"`;
  if (ttl === undefined) return { mode, ttlMs: DEFAULT_APPROVAL_TTL_MS };
  const ttlMs = approvalTtlMs(ttl);
  if (ttlMs === undefined)
    return `policy "${id}": @approval_ttl must be a duration such as "30m", "24h" or "7d", not "${ttl}"`;
  return { mode, ttlMs };
}

/** What evaluating one request against one set found. */
export interface SetVerdict {
  /** `allow`, `deny`, or undefined when it depends on what was left unknown. */
  decision: "allow" | "deny" | undefined;
  /** The ids of the policies that made the decision (none: no policy permits). */
  policies: string[];
}

/** What is left of a set to evaluate per request of one shape (see `authorizeFor`). */
interface Residual {
  /** The pre-parsed set of the policies still undecided. */
  key: string;
  /** Permits satisfied whatever the unknowns are. */
  permits: string[];
  /** Whether the residual reads the request's entities. */
  entities: boolean;
}

/**
 * A residual's verdict with the permits known satisfied added: they allow unless a forbid
 * denied, and are among the reasons of an allow (in Cedar's order, sorted by id).
 */
function withPermits(verdict: SetVerdict, permits: readonly string[]): SetVerdict {
  if (permits.length === 0) return verdict;
  const forbidden = verdict.decision === "deny" && verdict.policies.length > 0;
  if (forbidden) return verdict;
  return { decision: "allow", policies: [...new Set([...verdict.policies, ...permits])].sort() };
}

/** One request to a set: Cedar's principal, action, resource, context and entities. */
export interface CedarRequest {
  principal: EntityUidJson;
  action: EntityUidJson;
  resource: EntityUidJson;
  context: Context;
  entities: EntityJson[];
}

function lineAndColumn(text: string, offset: number): { line: number; column: number } {
  const before = text.slice(0, Math.max(0, Math.min(offset, text.length)));
  const lines = before.split("\n");
  return { line: lines.length, column: (lines.at(-1)?.length ?? 0) + 1 };
}

function problemsOf(errors: DetailedError[], text: string, base = 0): PolicyProblem[] {
  return errors.map((e) => {
    const at = e.sourceLocations?.[0];
    const label = at?.label ? ` (${at.label})` : "";
    return { ...lineAndColumn(text, base + (at?.start ?? 0)), message: `${e.message}${label}` };
  });
}

/** Residuals kept per set before the cache starts over. */
const MAX_RESIDUALS = 20_000;

/**
 * A residual policy with each `unknown("<attr>")` of the context turned back into
 * `context.<attr>`, so the residual is evaluated against the full request.
 */
function knownAgain(node: unknown): unknown {
  if (Array.isArray(node)) return node.map(knownAgain);
  if (typeof node !== "object" || node === null) return node;
  const record = node as Record<string, unknown>;
  const unknown = record.unknown;
  if (Array.isArray(unknown) && Object.keys(record).length === 1) {
    const name = (unknown[0] as { Value?: unknown } | undefined)?.Value;
    if (typeof name === "string") return { ".": { left: { Var: "context" }, attr: name } };
  }
  return Object.fromEntries(Object.entries(record).map(([k, v]) => [k, knownAgain(v)]));
}

/**
 * A compiled Cedar policy set: parsed, validated against {@link CEDAR_SCHEMA}, and cached in
 * the Cedar engine under a key derived from its text. Policy ids are the `@id("…")`
 * annotation of each policy, or `policy<N>` (its place in the file, from 0).
 */
export class CompiledPolicySet {
  /** Policy ids, in file order. */
  readonly ids: readonly string[];
  /** The source text. */
  readonly text: string;
  /** Annotations of each policy, by id (e.g. `approval`). */
  readonly annotations: ReadonlyMap<string, Readonly<Record<string, string>>>;
  /** The permits annotated `@approval`, by id: a call they allow waits for a person. */
  readonly approvals: ReadonlyMap<string, ApprovalRule>;
  readonly #key: string;
  readonly #texts: Readonly<Record<string, string>>;
  readonly #forbids: ReadonlySet<string>;
  // Per request shape (see `authorizeFor`): the verdict when the unknowns do not matter, else
  // what is left to evaluate per request.
  readonly #residuals = new Map<string, SetVerdict | Residual>();

  private constructor(
    text: string,
    texts: Record<string, string>,
    policies: Map<string, { effect: string; annotations: Record<string, string> }>,
    approvals: Map<string, ApprovalRule>,
  ) {
    this.text = text;
    this.approvals = approvals;
    this.#texts = texts;
    this.ids = [...policies.keys()];
    this.annotations = new Map([...policies].map(([id, p]) => [id, p.annotations]));
    this.#forbids = new Set(
      [...policies].filter(([, p]) => p.effect === "forbid").map(([id]) => id),
    );
    this.#key = `toolmesh:${createHash("sha256").update(text).digest("hex")}`;
  }

  /** Parses and validates `text`; throws {@link PolicySetError} naming line and column. */
  static compile(text: string): CompiledPolicySet {
    const parts = cedar.policySetTextToParts(text);
    if (parts.type === "failure") throw new PolicySetError(problemsOf(parts.errors, text));
    const texts: Record<string, string> = {};
    const policies = new Map<string, { effect: string; annotations: Record<string, string> }>();
    const offsets = new Map<string, number>();
    const approvals = new Map<string, ApprovalRule>();
    let cursor = 0;
    for (const [index, part] of parts.policies.entries()) {
      const found = text.indexOf(part, cursor);
      const offset = found < 0 ? cursor : found;
      cursor = found < 0 ? cursor : found + part.length;
      const json = cedar.policyToJson(part);
      if (json.type === "failure") throw new PolicySetError(problemsOf(json.errors, text, offset));
      const annotations = { ...json.json.annotations } as Record<string, string>;
      const id = annotations.id ?? `policy${index}`;
      const rule = approvalRuleOf(id, json.json.effect, annotations);
      if (typeof rule === "string")
        throw new PolicySetError([{ ...lineAndColumn(text, offset), message: rule }]);
      if (rule !== undefined) approvals.set(id, rule);
      if (policies.has(id))
        throw new PolicySetError([
          { ...lineAndColumn(text, offset), message: `policy id "${id}" is used twice` },
        ]);
      texts[id] = part;
      offsets.set(id, offset);
      policies.set(id, { effect: json.json.effect, annotations });
    }
    if (parts.policy_templates.length > 0)
      throw new PolicySetError([
        { line: 1, column: 1, message: "policy templates are not supported" },
      ]);
    const validated = cedar.validate({ schema: CEDAR_SCHEMA, policies: { staticPolicies: texts } });
    if (validated.type === "failure") throw new PolicySetError(problemsOf(validated.errors, text));
    if (validated.validationErrors.length > 0) {
      throw new PolicySetError(
        validated.validationErrors.flatMap((v) =>
          problemsOf([v.error], text, offsets.get(v.policyId) ?? 0).map((p) => ({
            ...p,
            // Locations of validation errors are relative to their policy.
            message: `policy "${v.policyId}": ${p.message}`,
          })),
        ),
      );
    }
    const set = new CompiledPolicySet(text, texts, policies, approvals);
    const cached = cedar.preparsePolicySet(set.#key, { staticPolicies: texts });
    if (cached.type === "failure") throw new PolicySetError(problemsOf(cached.errors, text));
    return set;
  }

  /** Decides a request whose context is fully known. A failing `forbid` policy denies. */
  authorize(request: CedarRequest): SetVerdict {
    return this.#authorizeWith(this.#key, request);
  }

  #authorizeWith(key: string, request: CedarRequest): SetVerdict {
    const answer = cedar.statefulIsAuthorized({ ...request, preparsedPolicySetId: key });
    if (answer.type === "failure") {
      throw new ToolmeshError(
        ErrorCode.Internal,
        `policy evaluation failed: ${answer.errors[0]?.message ?? "unknown error"}`,
      );
    }
    const { decision, diagnostics } = answer.response;
    // A forbid that could not be evaluated (an argument of another type than it expects)
    // refuses: a guard that errs must not open the door.
    const failedForbids = diagnostics.errors
      .map((e) => e.policyId)
      .filter((id) => this.#forbids.has(id));
    if (failedForbids.length > 0) return { decision: "deny", policies: failedForbids };
    return { decision, policies: diagnostics.reason };
  }

  /**
   * Decides `request` as {@link authorize} does, evaluating only the policies that partial
   * evaluation of `shape` (the same request with arguments and session unknown) left
   * undecided, with what it already knows folded in. The residual is computed once per
   * `shapeKey` and kept with this set; Cedar's cost grows with the number of policies.
   */
  authorizeFor(shapeKey: string, shape: () => CedarRequest, request: CedarRequest): SetVerdict {
    let residual = this.#residuals.get(shapeKey);
    if (residual === undefined) {
      residual = this.#residualOf(shape());
      if (this.#residuals.size >= MAX_RESIDUALS) this.#residuals.clear();
      this.#residuals.set(shapeKey, residual);
    }
    if (!("key" in residual)) return residual;
    const verdict = this.#authorizeWith(
      residual.key,
      residual.entities ? request : { ...request, entities: [] },
    );
    return withPermits(verdict, residual.permits);
  }

  /**
   * What partial evaluation of `shape` leaves to decide per request: the policies whose
   * conditions still read an unknown, pre-parsed on their own; the permits it found satisfied
   * whatever the unknowns are are kept aside as ids (evaluating them again would only cost).
   */
  #residualOf(shape: CedarRequest): SetVerdict | Residual {
    const partial = this.#partial(shape);
    if ("denied" in partial) return partial.denied;
    const { response } = partial;
    if (response.decision !== null && !this.#approvalUndecided(response))
      return { decision: response.decision, policies: response.mustBeDetermining };
    const kept: Record<string, PolicyJson> = {};
    const permits: string[] = [];
    for (const [id, policy] of Object.entries(response.residuals)) {
      const bodies = policy.conditions.map((c) => `${c.kind}:${JSON.stringify(c.body)}`);
      if (bodies.includes('when:{"Value":false}') || bodies.includes('unless:{"Value":true}'))
        continue;
      const always = bodies.every(
        (b) => b === 'when:{"Value":true}' || b === 'unless:{"Value":false}',
      );
      if (always && policy.effect === "permit" && !this.#forbids.has(id)) permits.push(id);
      else kept[id] = knownAgain(policy) as PolicyJson;
    }
    const json = JSON.stringify(kept);
    const key = `toolmesh:r:${createHash("sha256").update(json).digest("hex")}`;
    const parsed = cedar.preparsePolicySet(key, { staticPolicies: kept });
    if (parsed.type === "failure") {
      throw new ToolmeshError(
        ErrorCode.Internal,
        `policy residual failed: ${parsed.errors[0]?.message ?? "unknown error"}`,
      );
    }
    // Known entities' attributes are folded into the residual; it needs the entities only when
    // it still names the principal, the resource or an entity whose attributes it may read.
    const entities = ['"Var":"principal"', '"Var":"resource"', '"__entity"'].some((name) =>
      json.includes(name),
    );
    return { key, permits, entities };
  }

  /**
   * Whether an allow leaves open a permit annotated `@approval`: whether the call waits for a
   * person then depends on what was unknown, so the allow alone does not decide it.
   */
  #approvalUndecided(response: ResidualResponse): boolean {
    return (
      response.decision === "allow" &&
      response.mayBeDetermining.some(
        (id) => this.approvals.has(id) && !response.mustBeDetermining.includes(id),
      )
    );
  }

  /**
   * Cedar's partial answer to `request`, or the refusal of a `forbid` that could not be
   * evaluated (fail closed).
   */
  #partial(request: CedarRequest): { response: ResidualResponse } | { denied: SetVerdict } {
    const answer = cedar.isAuthorizedPartial({
      ...request,
      policies: { staticPolicies: { ...this.#texts } },
    });
    if (answer.type === "failure") {
      throw new ToolmeshError(
        ErrorCode.Internal,
        `policy evaluation failed: ${answer.errors[0]?.message ?? "unknown error"}`,
      );
    }
    const { response } = answer;
    const failedForbids = response.errored.filter((id) => this.#forbids.has(id));
    if (failedForbids.length > 0) return { denied: { decision: "deny", policies: failedForbids } };
    return { response };
  }

  /**
   * Decides a request whose context holds unknowns (`{"__extn":{"fn":"unknown",…}}`):
   * `decision` is undefined when the answer depends on them.
   */
  authorizePartial(request: CedarRequest): SetVerdict {
    const partial = this.#partial(request);
    if ("denied" in partial) return partial.denied;
    const { response } = partial;
    if (response.decision === null || this.#approvalUndecided(response))
      return { decision: undefined, policies: response.mayBeDetermining };
    return { decision: response.decision, policies: response.mustBeDetermining };
  }
}
