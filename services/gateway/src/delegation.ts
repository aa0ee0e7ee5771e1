import type { NatsConnection } from "@nats-io/nats-core";
import { requestOk } from "@toolmesh/nats";
import {
  DelegationDepositReplySchema,
  ErrorCode,
  ToolmeshError,
  requestToken,
  workOwnerOf,
} from "@toolmesh/protocol";
import type {
  DelegationDeposit,
  Subjects,
  TokenEndpoint,
  ToolDefinition,
} from "@toolmesh/protocol";
import type { Logger } from "@toolmesh/telemetry";
import { bearerTokenOf } from "./auth.js";
import type { Principal } from "./auth.js";

const TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange";
const ACCESS_TOKEN = "urn:ietf:params:oauth:token-type:access_token";
const REFRESH_TOKEN = "urn:ietf:params:oauth:token-type:refresh_token";

/** A grant the caller has not given: what the authorization server must be asked to allow. */
export interface ConsentNeeded {
  /** The tool's audience at the authorization server. */
  readonly audience: string;
  readonly scopes: readonly string[];
}

/**
 * Deferred delegation at submission (ADR 0063): for a tool declaring `token-exchange`
 * credentials, the caller's verified token is exchanged (RFC 8693) for a refresh token for the
 * tool's audience, which is handed to the executors that serve the tool, in the account they
 * live in, where it is sealed and kept until the call ends. The gateway keeps nothing.
 */
export class CallDelegation {
  readonly #nc: NatsConnection;
  readonly #subjects: Subjects;
  readonly #endpoint: TokenEndpoint;
  readonly #log: Logger;
  readonly #waitMs: number;

  /**
   * `waitMs` bounds how long a deposit waits for an executor of the tool to take it (none
   * running: a restart, a scale from zero) before the call is refused `unavailable`.
   */
  constructor(
    nc: NatsConnection,
    subjects: Subjects,
    endpoint: TokenEndpoint,
    log: Logger,
    waitMs: number,
  ) {
    this.#nc = nc;
    this.#subjects = subjects;
    this.#endpoint = endpoint;
    this.#log = log;
    this.#waitMs = waitMs;
  }

  /**
   * Obtains and deposits the grant of call `callId` when `tool` needs one. A caller whose
   * token the authorization server does not exchange (no consent) is answered with what to
   * consent to; the caller may be asked for it, or the call let through to end
   * `credential_required` where it runs, on its record. A caller with a key rather than a token
   * is let through. An authorization server or executors out of reach is `unavailable`.
   */
  async prepare(
    callId: string,
    tool: ToolDefinition | undefined,
    principal: Principal,
  ): Promise<ConsentNeeded | undefined> {
    const declared = tool?.credentials;
    if (tool === undefined || declared?.type !== "token-exchange") return undefined;
    const token = bearerTokenOf(principal);
    const identity = principal.identity;
    if (token === undefined || identity === undefined) return undefined;
    let grant: string | undefined;
    try {
      const res = await requestToken(
        this.#endpoint,
        {
          grant_type: TOKEN_EXCHANGE,
          subject_token: token,
          subject_token_type: ACCESS_TOKEN,
          requested_token_type: REFRESH_TOKEN,
          audience: declared.audience,
          ...(declared.scopes.length === 0 ? {} : { scope: declared.scopes.join(" ") }),
        },
        `a delegation of user "${identity.subject}" for ${declared.audience}`,
      );
      // RFC 8693 §2.2.1: an issued refresh token comes as `access_token`, typed by
      // `issued_token_type`; servers that also hand out an access token add `refresh_token`.
      grant = res.issued_token_type === REFRESH_TOKEN ? res.access_token : res.refresh_token;
    } catch (err) {
      if (!(err instanceof ToolmeshError) || err.code !== ErrorCode.CredentialRequired) throw err;
      this.#log.info(
        { tool: tool.name, subject: identity.subject, reason: err.details?.reason },
        "no delegation for the call",
      );
      return { audience: declared.audience, scopes: declared.scopes };
    }
    if (grant === undefined) {
      this.#log.warn(
        { tool: tool.name, audience: declared.audience },
        "the authorization server issued no refresh token for the exchange; the call cannot run later",
      );
      return undefined;
    }
    const deposit: DelegationDeposit = {
      call_id: callId,
      identity,
      audience: declared.audience,
      grant,
    };
    await this.#deposit(deposit, tool);
    return undefined;
  }

  /**
   * Hands the grant to an executor of the tool, waiting (with backoff, at most `waitMs`) while
   * none answers: the grant stays in this process meanwhile, and the call is submitted after.
   */
  async #deposit(deposit: DelegationDeposit, tool: ToolDefinition): Promise<void> {
    const until = Date.now() + this.#waitMs;
    for (let delay = 100; ; delay = Math.min(delay * 2, 2_000)) {
      try {
        await requestOk(
          this.#nc,
          this.#subjects.delegationDeposit(workOwnerOf(tool)),
          deposit,
          DelegationDepositReplySchema,
          { service: `executor of "${tool.name}"`, timeoutMs: 10_000 },
        );
        return;
      } catch (err) {
        const unavailable = err instanceof ToolmeshError && err.code === ErrorCode.Unavailable;
        if (!unavailable || Date.now() + delay >= until) throw err;
        if (delay === 100)
          this.#log.info({ tool: tool.name, err }, "no executor took the delegation yet; waiting");
        await new Promise((resolve) => setTimeout(resolve, delay));
      }
    }
  }
}
