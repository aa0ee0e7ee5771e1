import { createHash } from "node:crypto";
import { ErrorCode, ToolmeshError } from "./errors.js";

/**
 * Tool names as model providers accept them. OpenAI and Anthropic take function and tool names
 * matching `^[a-zA-Z0-9_-]{1,64}$`; Gemini `^[a-zA-Z_][a-zA-Z0-9_.:-]{0,63}$`. Mesh names such as
 * `everything.get-sum` or a 100-character OpenAPI operation name do not fit: this module is the
 * one mapping the client formats, the catalog and the gateway use (docs/protocol.md, "Provider-
 * safe tool names").
 */

/** Model providers whose name rules this module knows. */
export type ProviderName = "openai" | "anthropic" | "gemini";

/** Longest function name every supported provider accepts, in characters. */
export const MAX_PROVIDER_NAME_LENGTH = 64;

/** The names OpenAI and Anthropic accept: what {@link safeToolName} always returns. */
export const PROVIDER_SAFE_NAME = /^[a-zA-Z0-9_-]{1,64}$/;

/**
 * A catalog's tool names as one provider sees them, both ways. Names the provider already
 * accepts map to themselves; others are sanitized (see {@link providerSafeName}) and, where
 * two would collide, suffixed with a hash of the original name.
 */
export interface NameMap {
  /** The provider whose rules the safe names follow. */
  readonly provider: ProviderName;
  /** toolmesh name → provider-safe name. */
  readonly toProvider: ReadonlyMap<string, string>;
  /** provider-safe name → toolmesh name. */
  readonly toTool: ReadonlyMap<string, string>;
}

const OPENAI_INVALID = /[^a-zA-Z0-9_-]/gu;
// Gemini: letters, digits, `_ . : -`, starting with a letter or underscore, at most 64.
const GEMINI_NAME = /^[a-zA-Z_][a-zA-Z0-9_.:-]{0,63}$/;
const GEMINI_INVALID = /[^a-zA-Z0-9_.:-]/gu;
const HASH_LENGTH = 8;

/**
 * A name the provider accepts as a function name. A valid name is returned unchanged;
 * otherwise each disallowed character becomes `_` (Gemini also gets a leading `_` when the
 * name does not start with a letter or underscore), and a name longer than 64 characters is
 * cut and suffixed with `_` and 8 hex digits of its SHA-256. Two different names can give the
 * same result (`a.b`, `a_b`): the registry refuses to register the second
 * ({@link safeToolName}), and {@link createNameMap} resolves that across any other list.
 */
export function providerSafeName(name: string, provider: ProviderName = "openai"): string {
  if (isValidName(name, provider)) return name;
  const safe = sanitize(name, provider);
  return safe.length <= MAX_PROVIDER_NAME_LENGTH && safe !== "" ? safe : suffixed(safe, name);
}

/**
 * The mesh's provider-safe name of a tool, accepted by OpenAI and Anthropic (and Gemini, except
 * for a name starting with a digit or `-`): {@link providerSafeName} for `"openai"`. It depends
 * on the tool's name alone, and no two registered tools share one (the registry refuses the
 * second), so it names the tool as surely as its own name does.
 */
export function safeToolName(name: string): string {
  return providerSafeName(name, "openai");
}

/**
 * Builds the two-way name map of a catalog for one provider. Valid names keep themselves;
 * a sanitized name shared by two tools, or equal to another tool's valid name, gets a hash
 * suffix on every tool that needed sanitizing, so the result does not depend on the order of
 * `names`. Throws `invalid_request` on duplicate tool names. For names the registry holds, the
 * map is {@link providerSafeName} on each name.
 */
export function createNameMap(names: Iterable<string>, provider: ProviderName = "openai"): NameMap {
  const unique: string[] = [];
  const seen = new Set<string>();
  for (const name of names) {
    if (seen.has(name)) {
      throw new ToolmeshError(ErrorCode.InvalidRequest, `duplicate tool name in catalog: ${name}`, {
        details: { tool: name },
      });
    }
    seen.add(name);
    unique.push(name);
  }
  const candidate = new Map(unique.map((name) => [name, providerSafeName(name, provider)]));
  const claims = new Map<string, number>();
  for (const safe of candidate.values()) claims.set(safe, (claims.get(safe) ?? 0) + 1);

  const toProvider = new Map<string, string>();
  const toTool = new Map<string, string>();
  for (const name of unique) {
    const safe = candidate.get(name) ?? name;
    const chosen =
      safe === name || claims.get(safe) === 1 ? safe : suffixed(sanitize(name, provider), name);
    const holder = toTool.get(chosen);
    if (holder !== undefined) {
      // Only reachable through a SHA-256 prefix collision or a valid name that literally
      // equals another tool's hashed name; refuse rather than send an ambiguous catalog.
      throw new ToolmeshError(
        ErrorCode.InvalidRequest,
        `tools ${holder} and ${name} both map to the provider name ${chosen}`,
        { details: { tools: [holder, name], provider_name: chosen, provider } },
      );
    }
    toProvider.set(name, chosen);
    toTool.set(chosen, name);
  }
  return { provider, toProvider, toTool };
}

/** The toolmesh name of a provider-side name; unknown names are returned unchanged. */
export function toolNameOf(providerName: string, nameMap?: NameMap): string {
  return nameMap?.toTool.get(providerName) ?? providerName;
}

function isValidName(name: string, provider: ProviderName): boolean {
  return (provider === "gemini" ? GEMINI_NAME : PROVIDER_SAFE_NAME).test(name);
}

function sanitize(name: string, provider: ProviderName): string {
  if (provider !== "gemini") return name.replace(OPENAI_INVALID, "_");
  const safe = name.replace(GEMINI_INVALID, "_");
  return /^[a-zA-Z_]/.test(safe) ? safe : `_${safe}`;
}

function suffixed(safe: string, original: string): string {
  const hash = createHash("sha256").update(original).digest("hex").slice(0, HASH_LENGTH);
  return `${safe.slice(0, MAX_PROVIDER_NAME_LENGTH - HASH_LENGTH - 1)}_${hash}`;
}
