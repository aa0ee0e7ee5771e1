import type { ToolDefinition } from "@toolmesh/protocol";
import {
  Defaults,
  ErrorCode,
  ToolmeshError,
  encodeJson,
  payloadTooLarge,
} from "@toolmesh/protocol";

/**
 * What one registration may hold (ADR 0049): per tool, so that a describe, expand or schema
 * event of one tool always fits in a message, and per owner, so that one owner cannot fill
 * the registry every catalog is built from. Sizes in bytes of UTF-8 JSON.
 */
export interface RegistrationLimits {
  /** Largest `description`. Default 16 KiB. */
  descriptionBytes: number;
  /** Largest `parameters` schema. Default 64 KiB. */
  schemaBytes: number;
  /** Largest `annotations`. Default 4 KiB. */
  annotationsBytes: number;
  /** Largest definition as a whole. Default 128 KiB. */
  definitionBytes: number;
  /** Most tools of one owner. Default 512. */
  toolsPerOwner: number;
  /** Most bytes of definitions of one owner. Default 4 MiB. */
  ownerBytes: number;
}

/** The limits registrations are held to when nobody configures others. */
export const DEFAULT_REGISTRATION_LIMITS: RegistrationLimits = {
  descriptionBytes: Defaults.maxToolDescriptionBytes,
  schemaBytes: Defaults.maxToolSchemaBytes,
  annotationsBytes: Defaults.maxToolAnnotationsBytes,
  definitionBytes: Defaults.maxToolDefinitionBytes,
  toolsPerOwner: Defaults.maxToolsPerOwner,
  ownerBytes: Defaults.maxOwnerRegistryBytes,
};

/**
 * Refuses a definition over a per-tool limit with `payload_too_large`, `details.field` naming
 * the part (`description`, `parameters`, `annotations`, `definition`), `bytes` and `limit`.
 * Returns the definition's encoded size.
 */
export function checkToolSize(definition: ToolDefinition, limits: RegistrationLimits): number {
  const parts: [string, unknown, number][] = [
    ["description", definition.description, limits.descriptionBytes],
    ["parameters", definition.parameters, limits.schemaBytes],
    ["annotations", definition.annotations ?? {}, limits.annotationsBytes],
  ];
  for (const [field, value, limit] of parts) {
    const bytes =
      typeof value === "string" ? Buffer.byteLength(value, "utf8") : encodeJson(value).length;
    if (bytes > limit) throw tooLarge(definition.name, field, bytes, limit);
  }
  const bytes = encodeJson(definition).length;
  if (bytes > limits.definitionBytes)
    throw tooLarge(definition.name, "definition", bytes, limits.definitionBytes);
  return bytes;
}

function tooLarge(tool: string, field: string, bytes: number, limit: number): ToolmeshError {
  return payloadTooLarge(
    `the ${field} of tool "${tool}" is ${bytes} bytes; a tool's ${field} may have at most ${limit}`,
    { field, bytes, limit, tool },
  );
}

/**
 * Refuses a registration that would take its owner over its number of tools or bytes, with
 * `quota_exceeded` (`details.quota` `owner_tools` or `owner_bytes`, `limit`, `scope` the owner).
 * `others` are the owner's other tools' encoded sizes; `bytes` the new definition's.
 */
export function checkOwnerRoom(
  owner: string,
  others: readonly number[],
  bytes: number,
  limits: RegistrationLimits,
): void {
  if (others.length + 1 > limits.toolsPerOwner) {
    throw new ToolmeshError(
      ErrorCode.QuotaExceeded,
      `owner ${owner} has ${others.length} tools registered; an owner may register at most ${limits.toolsPerOwner}`,
      {
        retryable: false,
        details: { scope: owner, quota: "owner_tools", limit: limits.toolsPerOwner },
      },
    );
  }
  const total = others.reduce((sum, b) => sum + b, bytes);
  if (total > limits.ownerBytes) {
    throw new ToolmeshError(
      ErrorCode.QuotaExceeded,
      `owner ${owner}'s tools would take ${total} bytes; an owner's tools may take at most ${limits.ownerBytes}`,
      {
        retryable: false,
        details: { scope: owner, quota: "owner_bytes", limit: limits.ownerBytes, bytes: total },
      },
    );
  }
}
