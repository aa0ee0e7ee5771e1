import { createHash, randomBytes } from "node:crypto";
import type {
  InputRequests,
  InputRequiredResult,
  RequestStateCodec,
  ServerContext,
} from "@modelcontextprotocol/server";
import {
  CLIENT_CAPABILITIES_META_KEY,
  createRequestStateCodec,
  inputRequired,
} from "@modelcontextprotocol/server";
import type { WaitingApproval } from "@toolmesh/call-store";
import type { ToolMessage } from "@toolmesh/protocol";
import { ErrorCode, ToolmeshError } from "@toolmesh/protocol";
import type { Principal } from "./auth.js";
import type { ConsentNeeded } from "./delegation.js";

/** A mesh call as the gateway sees it when it may ask its caller for input. */
export interface CallAtRest {
  /** The call's mesh id: what a `requestState` names and an answer resumes. */
  readonly callId: string;
  /** The tenant the call belongs to (the requester's). */
  readonly tenant: string;
  readonly tool: string;
  readonly arguments: Record<string, unknown>;
  /** The call's final message, when the mesh answered it (`missing_arguments`, for one). */
  readonly message?: ToolMessage;
  /** The person the call waits for, when it waits (read from the approvals bucket). */
  readonly waiting?: WaitingApproval;
  /** What its caller must authorize before the call, not yet submitted, can run as them. */
  readonly consent?: ConsentNeeded;
}

/** What an answer does to the call it answers. */
export type Resumption =
  /** Submit the same call id again with these arguments (a stored call is joined, not rerun). */
  | { readonly kind: "resubmit"; readonly arguments: Record<string, unknown> }
  /** The source resumed the stored call itself (an approval taken, say): it goes on as it is. */
  | { readonly kind: "resumed" }
  /** The answer cannot be used: the call is left as it was. */
  | { readonly kind: "refused"; readonly error: ToolmeshError };

/** The answer a source cannot use: the call is left as it was, the retry gets `code`. */
export function refused(code: ErrorCode, message: string): Resumption {
  return { kind: "refused", error: new ToolmeshError(code, message) };
}

/**
 * One reason a mesh call asks its caller for input: given a call, what to ask (if anything);
 * given the caller's answer, what to do. Sources are tried in order; the first that asks wins, and
 * its `kind` travels in the signed `requestState` so the answer comes back to the same source.
 */
export interface InputRequestSource {
  /** Names the source inside `requestState` (short, stable). */
  readonly kind: string;
  /** The elicitation mode its requests use: asked only of clients that declared it. */
  readonly mode: "form" | "url";
  /** The input requests for this call, or undefined when this source has nothing to ask. */
  ask(call: CallAtRest): InputRequests | undefined;
  /**
   * Whether the call still waits for this source's answer. False once an answer was taken (the
   * call was stored, approved, ...): a `requestState` is good for one answer.
   */
  waiting(tenant: string, callId: string): Promise<boolean>;
  /** What the caller's `inputResponses` do to the call. */
  answer(call: CallAtRest, responses: Record<string, unknown>): Resumption | Promise<Resumption>;
}

/** What a `requestState` carries: the call, the source that asked, and the request it answers. */
interface StatePayload {
  /** Call id. */
  c: string;
  /** Source kind. */
  k: string;
  /** Tool name. */
  t: string;
  /** Digest of the arguments of the request that was answered with `input_required`. */
  h: string;
}

/** Why a `requestState` was refused: `details.request_state` of the typed error. */
export type StateRefusal = "invalid" | "expired" | "foreign" | "used" | "mismatch";

/** A `requestState` taken: the call it names and the source that asked. */
export interface TakenState {
  readonly call: CallAtRest;
  readonly source: InputRequestSource;
}

/**
 * `input_required` for mesh calls: asks a call's caller for what the call lacks, signs what the
 * answer must come back with (`requestState`: HMAC-SHA256 under a key every replica shares, bound
 * to the tenant and credential, expiring), and takes the answer on any replica, once.
 */
export class InputRequired {
  readonly #codec: RequestStateCodec<StatePayload>;
  readonly #sources: readonly InputRequestSource[];

  constructor(options: {
    /** The shared key; unset: a random key of this process (one replica only). */
    key: string | undefined;
    ttlMs: number;
    sources: readonly InputRequestSource[];
  }) {
    this.#sources = options.sources;
    this.#codec = createRequestStateCodec<StatePayload>({
      key: options.key ?? randomBytes(32),
      ttlSeconds: Math.max(1, Math.round(options.ttlMs / 1000)),
      bind: (ctx) => bindingOf(principalOf(ctx)),
    });
  }

  /**
   * The `input_required` answer for a call, when a source has something to ask and the client
   * takes that source's elicitation mode; undefined otherwise (the call's own answer stands).
   */
  async ask(ctx: ServerContext, call: CallAtRest): Promise<InputRequiredResult | undefined> {
    const modes = elicitationModes(ctx);
    for (const source of this.#sources) {
      if (!modes.has(source.mode)) continue;
      const inputRequests = source.ask(call);
      if (inputRequests === undefined) continue;
      const payload: StatePayload = {
        c: call.callId,
        k: source.kind,
        t: call.tool,
        h: argumentsDigest(call.arguments),
      };
      return inputRequired({ inputRequests, requestState: await this.#codec.mint(payload, ctx) });
    }
    return undefined;
  }

  /**
   * The call a retried request's `requestState` names, checked: signed by a replica, not
   * expired, issued to this principal, for this request (tool and arguments, and `callId` when
   * given), and still waiting for its answer. Throws a typed `invalid_request` that says which.
   */
  async take(
    ctx: ServerContext,
    state: string,
    request: { tool?: string; arguments?: Record<string, unknown>; callId?: string },
  ): Promise<TakenState> {
    let payload: StatePayload;
    try {
      payload = await this.#codec.verify(state, ctx);
    } catch (err) {
      const reason = err instanceof Error ? err.message : "";
      throw refusal(reason === "expired" ? "expired" : reason === "bind" ? "foreign" : "invalid");
    }
    const source = this.#sources.find((s) => s.kind === payload.k);
    if (
      source === undefined ||
      (request.callId !== undefined && request.callId !== payload.c) ||
      (request.tool !== undefined && request.tool !== payload.t) ||
      (request.arguments !== undefined && argumentsDigest(request.arguments) !== payload.h)
    )
      throw refusal("mismatch");
    const { tenant } = principalOf(ctx);
    if (!(await source.waiting(tenant, payload.c))) throw refusal("used");
    return {
      source,
      call: { callId: payload.c, tenant, tool: payload.t, arguments: request.arguments ?? {} },
    };
  }
}

const REFUSALS: Record<StateRefusal, string> = {
  invalid: "requestState is not one this gateway issued (forged or altered)",
  expired: "requestState has expired",
  foreign: "requestState was issued to another credential",
  used: "requestState was already answered",
  mismatch: "requestState was issued for another request",
};

/** The typed error of a refused `requestState`. */
export function refusal(reason: StateRefusal): ToolmeshError {
  return new ToolmeshError(
    ErrorCode.InvalidRequest,
    `${REFUSALS[reason]}: send the request again without requestState and inputResponses`,
    { details: { request_state: reason } },
  );
}

/** The elicitation modes the request's client declared (2026-07-28 envelope). */
function elicitationModes(ctx: ServerContext): ReadonlySet<"form" | "url"> {
  const envelope = ctx.mcpReq.envelope as Record<string, unknown> | undefined;
  const capabilities = envelope?.[CLIENT_CAPABILITIES_META_KEY] as
    { elicitation?: { form?: unknown; url?: unknown } } | undefined;
  const elicitation = capabilities?.elicitation;
  const modes = new Set<"form" | "url">();
  if (elicitation === undefined) return modes;
  // An empty elicitation capability means form mode.
  if (elicitation.form !== undefined || elicitation.url === undefined) modes.add("form");
  if (elicitation.url !== undefined) modes.add("url");
  return modes;
}

function principalOf(ctx: ServerContext): Principal {
  const scope = ctx.http?.authInfo?.extra?.scope as { principal?: Principal } | undefined;
  if (scope?.principal === undefined) throw new Error("a request without a scope");
  return scope.principal;
}

function bindingOf(principal: Principal): string {
  return `${principal.tenant}\n${principal.credential}`;
}

function argumentsDigest(args: Record<string, unknown>): string {
  return createHash("sha256").update(JSON.stringify(args), "utf8").digest("base64url").slice(0, 22);
}
