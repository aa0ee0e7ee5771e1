import type { InputRequests } from "@modelcontextprotocol/server";
import { inputRequired, inputResponse } from "@modelcontextprotocol/server";
import { ErrorCode } from "@toolmesh/protocol";
import type { ConsentNeeded } from "./delegation.js";
import type { CallAtRest, InputRequestSource, Resumption } from "./input-required.js";
import { refused } from "./input-required.js";

/** The key of the one URL this source asks the caller to visit. */
const URL_REQUEST = "consent";

/**
 * A call of a tool that acts as its caller (`token-exchange` credentials, ADR 0063) whose caller
 * has not authorized the tool's audience at the authorization server: before the call is
 * submitted, asks the caller, in URL mode, to open the authorization server's consent page
 * (`TOOLMESH_GATEWAY_CONSENT_URL`, with `{audience}` and `{scope}` filled in) and to accept once
 * done. The retry submits the same call id, which exchanges the caller's token again: a caller
 * who did not authorize is asked again; decline ends the call `cancelled`, nothing submitted.
 */
export class ConsentInput implements InputRequestSource {
  readonly kind = "u";
  readonly mode = "url";

  /**
   * @param template the consent page's URL, `{audience}` and `{scope}` in it replaced (encoded)
   * @param stored whether the mesh holds a record of the call (it then no longer waits)
   */
  constructor(
    private readonly template: string,
    private readonly stored: (tenant: string, callId: string) => Promise<boolean>,
  ) {}

  ask(call: CallAtRest): InputRequests | undefined {
    const consent = call.consent;
    if (consent === undefined) return undefined;
    return {
      [URL_REQUEST]: inputRequired.elicitUrl({
        message: `${call.tool} acts as you at ${consent.audience}: authorize it there, then accept to run the call.`,
        url: consentUrl(this.template, consent),
      }),
    };
  }

  async waiting(tenant: string, callId: string): Promise<boolean> {
    // Answered once: the call submitted after the consent is stored under the same id.
    return !(await this.stored(tenant, callId));
  }

  answer(call: CallAtRest, responses: Record<string, unknown>): Resumption {
    const view = inputResponse(responses, URL_REQUEST);
    if (view.kind !== "elicit")
      return refused(
        ErrorCode.InvalidRequest,
        `inputResponses has no answer to "${URL_REQUEST}": accept once the authorization is done, or decline`,
      );
    if (view.action !== "accept")
      return refused(ErrorCode.Cancelled, `the caller chose to ${view.action} the authorization`);
    return { kind: "resubmit", arguments: call.arguments };
  }
}

/** The consent page for `consent`: the template with `{audience}` and `{scope}` filled in. */
export function consentUrl(template: string, consent: ConsentNeeded): string {
  return template
    .replaceAll("{audience}", encodeURIComponent(consent.audience))
    .replaceAll("{scope}", encodeURIComponent(consent.scopes.join(" ")));
}
