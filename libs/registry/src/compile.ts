import { Ajv2020 } from "ajv/dist/2020.js";
import type { ErrorObject, ValidateFunction } from "ajv/dist/2020.js";
import formatsPlugin from "ajv-formats";
import { ErrorCode, ToolmeshError } from "@toolmesh/protocol";
import type { ParamType, ToolDefinition } from "@toolmesh/protocol";

export type { ErrorObject, ValidateFunction };

/** A JSON Schema as found in a tool definition: an object schema, or `true`/`false`. */
export type JsonSchema = boolean | Readonly<Record<string, unknown>>;

/** One top-level property of a tool's parameter schema, analysed once at registration. */
export interface CompiledParam {
  /** The property name, as the model writes it. */
  readonly name: string;
  /** The property's own schema, as written in the definition. */
  readonly schema: JsonSchema;
  /** Whether the model must give it; always `false` for system params. */
  readonly required: boolean;
  /** Whether the schema has a `default` keyword (a `null` default counts). */
  readonly hasDefault: boolean;
  /** The schema's `default`, `undefined` when it has none. Never mutate it. */
  readonly default: unknown;
  /** The value type in seed 000's vocabulary. */
  readonly type: ParamType;
  /** Whether this is a system param (seed 000: `executor`, `storage`), never the model's job. */
  readonly system: boolean;
}

/**
 * A tool definition prepared for resolving calls: compiled once when the tool is registered
 * or seen in the registry, then reused for every call.
 */
export interface CompiledTool {
  readonly definition: ToolDefinition;
  /** Registry revision the definition was read at. */
  readonly revision: number;
  /**
   * The model-facing schema: `definition.parameters` with the system params removed from
   * `required`. This is the schema a model is shown (for example with `missing_arguments`).
   */
  readonly schema: Readonly<Record<string, unknown>>;
  /**
   * Validates (and fills defaults into, in place) arguments against the model-facing schema.
   * System params are accepted as they are: their subschemas are replaced by `true`, so a
   * value the model gave for them is neither checked nor filled, and their defaults are not
   * applied. Not re-entrant across calls: read `validate.errors` right after calling it.
   */
  readonly validate: ValidateFunction;
  /** The top-level properties, in schema order, system params included and flagged. */
  readonly properties: readonly CompiledParam[];
  /** Names of the system params (`definition.system_params`). */
  readonly systemParams: ReadonlySet<string>;
}

let sharedAjv: Ajv2020 | undefined;

/**
 * The one Ajv instance every tool is compiled with, created on first use. Internal; exported
 * so tests can check that compiling leaves nothing behind in it.
 */
export function getSharedAjv(): Ajv2020 {
  if (sharedAjv === undefined) {
    const ajv = new Ajv2020({
      allErrors: true,
      useDefaults: true,
      strict: false,
      coerceTypes: false,
      // Without it `required: ["toString"]` is satisfied by Object.prototype and an absent
      // `constructor` param is validated as if the model had sent the Object function.
      ownProperties: true,
    });
    // `keywords: false`: ajv-formats resolves its own copy of ajv in this install, and the
    // formatMinimum/formatMaximum keywords built with that copy's code generator fail at
    // validation time ("….compare is not a function"). Plain `format` is unaffected.
    formatsPlugin.default(ajv, { keywords: false });
    sharedAjv = ajv;
  }
  return sharedAjv;
}

/**
 * Compiles a tool definition for resolving calls. Call it when a tool is registered or read
 * from the registry, never per call. Compiling leaves no schema registered in the shared
 * Ajv instance, so a tool may be compiled again with a new definition (same `$id` or not).
 *
 * @throws ToolmeshError `invalid_request` naming the tool when its parameter schema does not
 *   compile, or holds a `__proto__` key anywhere.
 */
export function compileTool(def: ToolDefinition, revision: number): CompiledTool {
  const parameters = def.parameters;
  const systemParams: ReadonlySet<string> = new Set(def.system_params);

  const protoAt = findProtoKey(parameters);
  if (protoAt !== undefined) {
    throw new ToolmeshError(
      ErrorCode.InvalidRequest,
      `tool "${def.name}": its parameter schema has a "__proto__" key at "${protoAt}", which is not allowed`,
      { details: { tool: def.name, path: protoAt } },
    );
  }

  const declaredRequired = Array.isArray(parameters["required"])
    ? (parameters["required"] as unknown[])
    : [];
  const modelRequired = declaredRequired.filter(
    (name) => typeof name !== "string" || !systemParams.has(name),
  );
  const schema: Readonly<Record<string, unknown>> =
    modelRequired.length === declaredRequired.length
      ? parameters
      : { ...parameters, required: modelRequired };

  const declaredProperties = isObject(parameters["properties"]) ? parameters["properties"] : {};
  const requiredNames = new Set(
    modelRequired.filter((name): name is string => typeof name === "string"),
  );
  const properties: CompiledParam[] = [];
  let validationProperties: Record<string, unknown> | undefined;
  for (const [name, propertySchema] of Object.entries(declaredProperties)) {
    const system = systemParams.has(name);
    const schemaOf: JsonSchema =
      isObject(propertySchema) || typeof propertySchema === "boolean" ? propertySchema : {};
    const hasDefault = isObject(schemaOf) && Object.hasOwn(schemaOf, "default");
    properties.push(
      Object.freeze({
        name,
        schema: schemaOf,
        required: !system && requiredNames.has(name),
        hasDefault,
        default: hasDefault ? (schemaOf as Record<string, unknown>)["default"] : undefined,
        type: paramTypeOf(schemaOf),
        system,
      }),
    );
    if (system) {
      validationProperties ??= { ...declaredProperties };
      validationProperties[name] = true;
    }
  }

  // `$schema` is dropped because MCP servers often send draft-07 URIs this Ajv does not know;
  // every tool schema is validated as 2020-12.
  const { $schema: _ignored, ...rest } = schema;
  const validationSchema: Record<string, unknown> = rest;
  if (validationProperties !== undefined) validationSchema["properties"] = validationProperties;

  return Object.freeze({
    definition: def,
    revision,
    schema,
    validate: compileDetached(def.name, validationSchema),
    properties: Object.freeze(properties),
    systemParams,
  });
}

/** Compiles with the shared Ajv, then forgets the schema (and any `$id` it registered). */
function compileDetached(tool: string, schema: Record<string, unknown>): ValidateFunction {
  const ajv = getSharedAjv();
  const refsBefore = new Set(Object.keys(ajv.refs));
  try {
    return ajv.compile(schema);
  } catch (err) {
    const reason = err instanceof Error ? err.message : String(err);
    throw new ToolmeshError(
      ErrorCode.InvalidRequest,
      `tool "${tool}": its parameter schema does not compile: ${reason}`,
      {
        details: { tool, reason },
        cause: err,
      },
    );
  } finally {
    ajv.removeSchema(schema);
    for (const key of Object.keys(ajv.refs)) {
      if (!refsBefore.has(key)) delete ajv.refs[key];
    }
  }
}

const TYPE_NAMES: Readonly<Record<string, ParamType>> = {
  string: "str",
  integer: "int",
  number: "float",
  boolean: "bool",
  array: "list",
  object: "dict",
};

/**
 * Maps a property schema to seed 000's value type: the first non-`"null"` of `type` (or of
 * `anyOf`/`oneOf` branches); a `$ref`, or `properties` without `type`, is `dict`; an
 * `enum`/`const` whose values share one JSON type takes that type; anything else is `str`.
 */
export function paramTypeOf(schema: unknown): ParamType {
  return typeOf(schema) ?? "str";
}

/** The schema's type, or `undefined` when it only allows `null` or says nothing. */
function typeOf(schema: unknown): ParamType | undefined {
  if (!isObject(schema)) return undefined;
  const type = schema["type"];
  if (typeof type === "string") return TYPE_NAMES[type];
  if (Array.isArray(type)) {
    // "null" has no entry in TYPE_NAMES, so the first non-null type wins.
    for (const name of type) {
      const mapped = typeof name === "string" ? TYPE_NAMES[name] : undefined;
      if (mapped !== undefined) return mapped;
    }
    return undefined;
  }
  for (const key of ["anyOf", "oneOf"] as const) {
    const branches = schema[key];
    if (!Array.isArray(branches)) continue;
    for (const branch of branches) {
      const found = typeOf(branch);
      if (found !== undefined) return found;
    }
  }
  if (typeof schema["$ref"] === "string" || isObject(schema["properties"])) return "dict";
  if (Array.isArray(schema["enum"])) return typeOfValues(schema["enum"]);
  if (Object.hasOwn(schema, "const")) return typeOfValues([schema["const"]]);
  return undefined;
}

/** The one JSON type all (non-null) values share, or `undefined`. */
function typeOfValues(values: readonly unknown[]): ParamType | undefined {
  let found: ParamType | undefined;
  for (const value of values) {
    if (value === null) continue;
    const type = valueType(value);
    // int and float mix into float: [1, 2.5] is a number enum.
    const merged =
      found === undefined || found === type
        ? type
        : isNumeric(found) && isNumeric(type)
          ? "float"
          : undefined;
    if (merged === undefined) return undefined;
    found = merged;
  }
  return found;
}

function valueType(value: unknown): ParamType {
  if (typeof value === "string") return "str";
  if (typeof value === "boolean") return "bool";
  if (typeof value === "number") return Number.isInteger(value) ? "int" : "float";
  if (Array.isArray(value)) return "list";
  return "dict";
}

function isNumeric(type: ParamType): boolean {
  return type === "int" || type === "float";
}

/** JSON pointer of the first own `__proto__` key in the schema, or `undefined`. */
function findProtoKey(root: unknown): string | undefined {
  const stack: { value: unknown; path: string }[] = [{ value: root, path: "" }];
  const seen = new Set<object>();
  for (let item = stack.pop(); item !== undefined; item = stack.pop()) {
    const { value, path } = item;
    if (typeof value !== "object" || value === null || seen.has(value)) continue;
    seen.add(value);
    if (Object.hasOwn(value, "__proto__")) return `${path}/__proto__`;
    for (const [key, child] of Object.entries(value)) {
      if (typeof child === "object" && child !== null) {
        stack.push({
          value: child,
          path: `${path}/${key.replaceAll("~", "~0").replaceAll("/", "~1")}`,
        });
      }
    }
  }
  return undefined;
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}
