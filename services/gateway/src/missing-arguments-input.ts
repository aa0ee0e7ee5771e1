import type { InputRequests } from "@modelcontextprotocol/server";
import { inputRequired, inputResponse } from "@modelcontextprotocol/server";
import { ErrorCode } from "@toolmesh/protocol";
import type { CallAtRest, InputRequestSource, Resumption } from "./input-required.js";
import { refused } from "./input-required.js";

/** The key of the one form this source asks. */
const FORM = "arguments";

/** JSON Schema keywords a form field keeps (the restricted schema elicitation allows). */
const FIELD_KEYWORDS = [
  "type",
  "title",
  "description",
  "enum",
  "enumNames",
  "minimum",
  "maximum",
  "minLength",
  "maxLength",
  "format",
  "default",
] as const;
const PRIMITIVE = new Set(["string", "number", "integer", "boolean"]);

type FieldSchema = Record<string, unknown>;

/**
 * A call the mesh answered `missing_arguments`: asks its caller, in one form, for exactly the
 * required arguments it left out (their schemas from the tool's definition), and submits the same
 * call id again with them. It asks only when every missing argument is a plain value a form can
 * hold; otherwise the call's `missing_arguments` answer stands.
 */
export class MissingArgumentsInput implements InputRequestSource {
  readonly kind = "m";
  readonly mode = "form";

  /** @param stored whether the mesh holds a record of the call (it then no longer waits). */
  constructor(private readonly stored: (tenant: string, callId: string) => Promise<boolean>) {}

  ask(call: CallAtRest): InputRequests | undefined {
    const fields = missingFields(call);
    if (fields === undefined) return undefined;
    return {
      [FORM]: inputRequired.elicit({
        message: `${call.tool} needs ${Object.keys(fields).join(", ")} to run`,
        requestedSchema: {
          type: "object",
          properties: fields as never,
          required: Object.keys(fields),
        },
      }),
    };
  }

  async waiting(tenant: string, callId: string): Promise<boolean> {
    // Answered once: the resubmitted call is stored under the same id.
    return !(await this.stored(tenant, callId));
  }

  answer(call: CallAtRest, responses: Record<string, unknown>): Resumption {
    const view = inputResponse(responses, FORM);
    if (view.kind !== "elicit")
      return refused(
        ErrorCode.InvalidRequest,
        `inputResponses has no answer to "${FORM}": answer the form the input_required result asked`,
      );
    if (view.action !== "accept")
      return refused(
        ErrorCode.Cancelled,
        `the caller chose to ${view.action} the missing arguments`,
      );
    // The resolver validates the values against the tool's schema, as for any call.
    return { kind: "resubmit", arguments: { ...call.arguments, ...(view.content ?? {}) } };
  }
}

/** The form fields of a `missing_arguments` answer, if every missing argument fits a form. */
function missingFields(call: CallAtRest): Record<string, FieldSchema> | undefined {
  const error = call.message?.error;
  if (error?.code !== ErrorCode.MissingArguments) return undefined;
  const details = error.details ?? {};
  const missing = Array.isArray(details.missing_required) ? details.missing_required : [];
  const parameters = (details.parameters ?? {}) as { properties?: Record<string, unknown> };
  const fields: Record<string, FieldSchema> = {};
  for (const name of missing) {
    if (typeof name !== "string") return undefined;
    const schema = parameters.properties?.[name] as FieldSchema | undefined;
    if (schema === undefined || !PRIMITIVE.has(schema.type as string)) return undefined;
    fields[name] = Object.fromEntries(
      FIELD_KEYWORDS.filter((k) => schema[k] !== undefined).map((k) => [k, schema[k]]),
    );
  }
  return missing.length === 0 ? undefined : fields;
}
