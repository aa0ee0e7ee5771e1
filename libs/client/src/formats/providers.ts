import type { NameMap, ToolCall } from "@toolmesh/protocol";
import { createNameMap, toolNameOf } from "@toolmesh/protocol";
import type { CatalogEntry } from "./catalog.js";
import { declaredParameters, describeEntry } from "./catalog.js";

// The name mapping lives in the contract library, shared with the catalog and the gateway.
export {
  MAX_PROVIDER_NAME_LENGTH,
  createNameMap,
  providerSafeName,
  toolNameOf,
} from "@toolmesh/protocol";
export type { NameMap, ProviderName } from "@toolmesh/protocol";

/** Tools formatted for one provider, with the name map needed to read its calls back. */
export interface ProviderTools<T> {
  /** Ready to put in the provider request's `tools` field. */
  tools: T[];
  /** Pass to `fromOpenAIToolCalls` / `fromAnthropicContent` / `fromGeminiParts`. */
  nameMap: NameMap;
}

/** An OpenAI Chat Completions `tools` entry. */
export interface OpenAITool {
  type: "function";
  function: { name: string; description: string; parameters: Record<string, unknown> };
}

/** An Anthropic Messages `tools` entry. */
export interface AnthropicTool {
  name: string;
  description: string;
  input_schema: Record<string, unknown>;
}

/**
 * Gemini's OpenAPI-3.0-subset schema. `type` uses JSON Schema's lowercase names, which the
 * Gemini API accepts as well as its upper-case enum names.
 */
export interface GeminiSchema {
  type?: string;
  format?: string;
  description?: string;
  nullable?: boolean;
  enum?: string[];
  items?: GeminiSchema;
  properties?: Record<string, GeminiSchema>;
  required?: string[];
  anyOf?: GeminiSchema[];
  minItems?: number;
  maxItems?: number;
  minLength?: number;
  maxLength?: number;
  minProperties?: number;
  maxProperties?: number;
  minimum?: number;
  maximum?: number;
  pattern?: string;
}

/** A Gemini function declaration; `parameters` is omitted for tools without properties. */
export interface GeminiFunctionDeclaration {
  name: string;
  description: string;
  parameters?: GeminiSchema;
}

/** A Gemini `tools` entry. */
export interface GeminiTool {
  function_declarations: GeminiFunctionDeclaration[];
}

/** One entry of an OpenAI `message.tool_calls` array, as the API returns it. */
export interface OpenAIToolCallInput {
  id: string;
  /** `"function"`; entries of other types (e.g. `"custom"`) are skipped. */
  type?: string;
  function: { name: string; arguments?: string | Record<string, unknown> };
}

/** One Anthropic response content block; only `tool_use` blocks are read. */
export interface AnthropicContentBlock {
  type: string;
  id?: string;
  name?: string;
  input?: unknown;
  [key: string]: unknown;
}

/** A Gemini function call as found in a response part. */
export interface GeminiFunctionCall {
  name: string;
  args?: Record<string, unknown>;
  id?: string;
}

/** One Gemini response part; `functionCall` (or the snake_case `function_call`) is read. */
export interface GeminiPart {
  functionCall?: GeminiFunctionCall;
  function_call?: GeminiFunctionCall;
  [key: string]: unknown;
}

/** Options of {@link fromGeminiParts}. */
export interface GeminiPartsOptions {
  /**
   * Prefix of the ids generated for calls without one: `<idPrefix>-<index>`, index counted
   * over the function calls of `parts` from 0. Default `"gemini"`. The client derives the
   * default idempotency key from the call id, so give each model turn its own prefix
   * (e.g. `"turn-7-gemini"`), or the second turn's `gemini-0` is taken for a duplicate.
   */
  idPrefix?: string;
}

/**
 * Formats a catalog for OpenAI Chat Completions function calling. Compact entries get the
 * permissive placeholder schema and a description saying the schema follows a first call.
 * A schema without a root `type` gets `type: "object"`; nothing else is changed.
 */
export function toOpenAITools(entries: readonly CatalogEntry[]): ProviderTools<OpenAITool> {
  const nameMap = createNameMap(
    entries.map((entry) => entry.name),
    "openai",
  );
  const tools = entries.map((entry): OpenAITool => ({
    type: "function",
    function: {
      name: safeNameOf(entry.name, nameMap),
      description: describeEntry(entry),
      parameters: objectRooted(declaredParameters(entry)),
    },
  }));
  return { tools, nameMap };
}

/** Formats a catalog for Anthropic Messages tool use; schemas as in {@link toOpenAITools}. */
export function toAnthropicTools(entries: readonly CatalogEntry[]): ProviderTools<AnthropicTool> {
  const nameMap = createNameMap(
    entries.map((entry) => entry.name),
    "anthropic",
  );
  const tools = entries.map((entry): AnthropicTool => ({
    name: safeNameOf(entry.name, nameMap),
    description: describeEntry(entry),
    input_schema: objectRooted(declaredParameters(entry)),
  }));
  return { tools, nameMap };
}

/**
 * Formats a catalog for Gemini function calling: one `tools` entry holding every declaration
 * (none for an empty catalog). Schemas go through {@link toGeminiSchema}; a declaration whose
 * schema has no properties (every compact entry) omits `parameters`, because Gemini rejects an
 * object schema with empty `properties`.
 */
export function toGeminiTools(entries: readonly CatalogEntry[]): ProviderTools<GeminiTool> {
  const nameMap = createNameMap(
    entries.map((entry) => entry.name),
    "gemini",
  );
  const declarations = entries.map((entry): GeminiFunctionDeclaration => {
    const declaration: GeminiFunctionDeclaration = {
      name: safeNameOf(entry.name, nameMap),
      description: describeEntry(entry),
    };
    if (entry.parameters !== undefined) {
      const parameters = toGeminiSchema(objectRooted(entry.parameters));
      if (parameters.properties !== undefined) declaration.parameters = parameters;
    }
    return declaration;
  });
  return {
    tools: declarations.length === 0 ? [] : [{ function_declarations: declarations }],
    nameMap,
  };
}

const GEMINI_FORMATS: Readonly<Record<string, readonly string[]>> = {
  string: ["enum", "date-time"],
  integer: ["int32", "int64"],
  number: ["float", "double"],
};

const COPIED_NUMBERS = [
  "minItems",
  "maxItems",
  "minLength",
  "maxLength",
  "minProperties",
  "maxProperties",
  "minimum",
  "maximum",
] as const;

/**
 * Converts a JSON Schema to Gemini's OpenAPI-3.0 subset. Kept: `type`, `description`,
 * `enum` (strings), `items`, `properties`, `required` (only names present in `properties`),
 * `anyOf`, `pattern`, `minimum`/`maximum`, `min`/`maxLength`, `min`/`maxItems`,
 * `min`/`maxProperties`, and `format` where Gemini allows it (string: `enum`, `date-time`;
 * integer: `int32`, `int64`; number: `float`, `double`).
 * Rewritten: `const` → one-value `enum`; `type: [T, "null"]` → `type: T, nullable: true`;
 * several non-null types → `anyOf`; `null` in `enum` or an `anyOf`/`oneOf` member
 * `{type:"null"}` → `nullable`; an `anyOf`/`oneOf` left with one member is merged into its
 * parent; `oneOf` → `anyOf` (looser: "exactly one" becomes "at least one"); a one-member
 * `allOf` is merged; local `$ref`s (`#/$defs/…`, `#/definitions/…`, any JSON pointer into the
 * root) are inlined, sibling keywords winning, and a recursive reference becomes
 * `{ type: "object" }`; a non-string `enum` (or `const`) is dropped and its values are listed
 * in the description ("Allowed values: …"); an `enum` without `type` gets `type: "string"`.
 * Dropped: everything else — notably `$schema`, `$id`, `$defs`, `definitions`, `title`,
 * `default`, `examples`, `additionalProperties`, `patternProperties`, `exclusiveMinimum`,
 * `exclusiveMaximum`, `multipleOf`, `uniqueItems`, `not`, `if`/`then`/`else`, multi-member
 * `allOf`, tuple `items` arrays, unresolvable `$ref`s (the node keeps only its siblings), and
 * an empty `properties` object.
 */
export function toGeminiSchema(schema: Record<string, unknown>): GeminiSchema {
  return convertSchema(schema, schema, []);
}

/**
 * Reads OpenAI `message.tool_calls` back into toolmesh calls, names mapped back through
 * `nameMap`. Arguments stay as the model wrote them when they are a string (the resolver
 * reports bad JSON as `invalid_arguments`); an object is serialized; absent becomes `"{}"`.
 */
export function fromOpenAIToolCalls(
  toolCalls: readonly OpenAIToolCallInput[] | null | undefined,
  nameMap?: NameMap,
): ToolCall[] {
  const calls: ToolCall[] = [];
  for (const call of toolCalls ?? []) {
    if (call.type !== undefined && call.type !== "function") continue;
    const args = call.function.arguments;
    calls.push(
      toolCall(
        call.id,
        toolNameOf(call.function.name, nameMap),
        typeof args === "string" ? args : JSON.stringify(args ?? {}),
      ),
    );
  }
  return calls;
}

/**
 * Reads the `tool_use` blocks of an Anthropic response's `content` into toolmesh calls, in
 * order, names mapped back through `nameMap`. Other blocks (text, thinking, server tools) are
 * skipped. `input` is serialized; absent becomes `"{}"`.
 */
export function fromAnthropicContent(
  contentBlocks: readonly AnthropicContentBlock[] | null | undefined,
  nameMap?: NameMap,
): ToolCall[] {
  const calls: ToolCall[] = [];
  for (const block of contentBlocks ?? []) {
    if (block.type !== "tool_use" || typeof block.id !== "string") continue;
    if (typeof block.name !== "string") continue;
    calls.push(
      toolCall(block.id, toolNameOf(block.name, nameMap), JSON.stringify(block.input ?? {})),
    );
  }
  return calls;
}

/**
 * Reads the function calls of a Gemini candidate's `content.parts` into toolmesh calls, in
 * order, names mapped back through `nameMap`. Gemini often sends no call id: those calls get
 * `<idPrefix>-<index>` (see {@link GeminiPartsOptions.idPrefix}). `args` is serialized;
 * absent (a call without arguments) becomes `"{}"`.
 */
export function fromGeminiParts(
  parts: readonly GeminiPart[] | null | undefined,
  nameMap?: NameMap,
  options: GeminiPartsOptions = {},
): ToolCall[] {
  const prefix = options.idPrefix ?? "gemini";
  const calls: ToolCall[] = [];
  for (const part of parts ?? []) {
    const call = part.functionCall ?? part.function_call;
    if (call === undefined || typeof call.name !== "string") continue;
    const id = call.id !== undefined && call.id !== "" ? call.id : `${prefix}-${calls.length}`;
    calls.push(toolCall(id, toolNameOf(call.name, nameMap), JSON.stringify(call.args ?? {})));
  }
  return calls;
}

function toolCall(id: string, name: string, args: string): ToolCall {
  return { id, type: "function", function: { name, arguments: args } };
}

function safeNameOf(name: string, nameMap: NameMap): string {
  return nameMap.toProvider.get(name) ?? name;
}

function objectRooted(schema: Record<string, unknown>): Record<string, unknown> {
  return schema.type === undefined ? { type: "object", ...schema } : schema;
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function resolvePointer(root: Record<string, unknown>, ref: string): unknown {
  if (!ref.startsWith("#")) return undefined;
  const pointer = decodeURIComponent(ref.slice(1));
  if (pointer === "") return root;
  if (!pointer.startsWith("/")) return undefined;
  let node: unknown = root;
  for (const raw of pointer.slice(1).split("/")) {
    const key = raw.replace(/~1/g, "/").replace(/~0/g, "~");
    if (Array.isArray(node)) node = node[Number(key)];
    else if (isRecord(node)) node = node[key];
    else return undefined;
  }
  return node;
}

function isNullSchema(value: unknown): boolean {
  return isRecord(value) && value.type === "null";
}

/** One node of {@link toGeminiSchema}; `refs` are the references being inlined above it. */
function convertSchema(node: unknown, root: Record<string, unknown>, refs: string[]): GeminiSchema {
  if (!isRecord(node)) return {};

  if (typeof node.$ref === "string") {
    const { $ref: ref, ...siblings } = node;
    const target = refs.includes(ref) ? undefined : resolvePointer(root, ref);
    const base: GeminiSchema = refs.includes(ref)
      ? { type: "object" }
      : target === undefined
        ? {}
        : convertSchema(target, root, [...refs, ref]);
    return { ...base, ...convertSchema(siblings, root, refs) };
  }

  if (Array.isArray(node.allOf) && node.allOf.length === 1 && isRecord(node.allOf[0])) {
    const { allOf: _allOf, ...rest } = node;
    return convertSchema({ ...node.allOf[0], ...rest }, root, refs);
  }

  const out: GeminiSchema = {};
  let nullable = node.nullable === true;
  if (convertVariants(node, out, root, refs)) nullable = true;
  if (convertType(node, out)) nullable = true;

  if (typeof node.description === "string") out.description = node.description;

  if (convertEnum(node, out)) nullable = true;

  if (typeof node.format === "string" && out.type !== undefined) {
    if (GEMINI_FORMATS[out.type]?.includes(node.format) === true) out.format = node.format;
  }

  if (isRecord(node.items)) out.items = convertSchema(node.items, root, refs);

  if (isRecord(node.properties) && Object.keys(node.properties).length > 0) {
    const properties: Record<string, GeminiSchema> = {};
    for (const [key, value] of Object.entries(node.properties)) {
      properties[key] = convertSchema(value, root, refs);
    }
    out.properties = properties;
  }
  if (Array.isArray(node.required) && out.properties !== undefined) {
    const present = out.properties;
    const required = node.required.filter(
      (name): name is string => typeof name === "string" && Object.hasOwn(present, name),
    );
    if (required.length > 0) out.required = required;
  }

  for (const key of COPIED_NUMBERS) {
    const value = node[key];
    if (typeof value === "number" && Number.isFinite(value)) out[key] = value;
  }
  if (typeof node.pattern === "string") out.pattern = node.pattern;
  if (nullable) out.nullable = true;
  return out;
}

/**
 * Writes a node's `anyOf`/`oneOf` into `out` without its null members: one left is merged, more
 * become `anyOf`. True when a member allowed null, which Gemini says with `nullable`.
 */
function convertVariants(
  node: Record<string, unknown>,
  out: GeminiSchema,
  root: Record<string, unknown>,
  refs: string[],
): boolean {
  const variants = Array.isArray(node.anyOf)
    ? node.anyOf
    : Array.isArray(node.oneOf)
      ? node.oneOf
      : undefined;
  if (variants === undefined) return false;
  let nullable = false;
  const kept = variants.filter((variant) => !isNullSchema(variant));
  if (kept.length < variants.length) nullable = true;
  if (kept.length === 1) {
    const merged = convertSchema(kept[0], root, refs);
    if (merged.nullable === true) nullable = true;
    Object.assign(out, merged);
  } else if (kept.length > 1) {
    out.anyOf = kept.map((variant) => convertSchema(variant, root, refs));
  }
  return nullable;
}

/**
 * Writes a node's `type` into `out`: one non-null type as is, several as `anyOf` (unless the
 * variants gave one). True when `null` was among them.
 */
function convertType(node: Record<string, unknown>, out: GeminiSchema): boolean {
  const rawTypes =
    typeof node.type === "string"
      ? [node.type]
      : Array.isArray(node.type)
        ? node.type.filter((t): t is string => typeof t === "string")
        : undefined;
  if (rawTypes === undefined) return false;
  const types = rawTypes.filter((t) => t !== "null");
  if (types.length === 1) out.type = types[0];
  else if (types.length > 1 && out.anyOf === undefined) {
    out.anyOf = types.map((t) => ({ type: t }));
  }
  return types.length < rawTypes.length;
}

/**
 * Writes a node's `enum` (or `const`) into `out`: string values as `enum`, others listed in the
 * description, as Gemini takes string enums only. True when `null` was among them.
 */
function convertEnum(node: Record<string, unknown>, out: GeminiSchema): boolean {
  const enumSource = Array.isArray(node.enum)
    ? (node.enum as unknown[])
    : "const" in node
      ? [node.const]
      : undefined;
  if (enumSource === undefined) return false;
  const values = enumSource.filter((value) => value !== null);
  if (values.every((value) => typeof value === "string")) {
    if (values.length > 0) {
      out.enum = values;
      out.type ??= "string";
    }
  } else {
    const allowed = `Allowed values: ${values.map((value) => JSON.stringify(value)).join(", ")}.`;
    out.description = out.description === undefined ? allowed : `${out.description} ${allowed}`;
  }
  return values.length < enumSource.length;
}
