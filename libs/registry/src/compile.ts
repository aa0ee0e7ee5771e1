import { Ajv2020 } from "ajv/dist/2020.js";
import type { ErrorObject, ValidateFunction } from "ajv/dist/2020.js";
import formatsPlugin from "ajv-formats";
import { RE2JS, RE2JSException } from "re2js";
import { ErrorCode, ToolmeshError, modelParameters } from "@toolmesh/protocol";
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
  /** The value type in the vocabulary of `input_parameters` (docs/protocol.md#resolvedcall). */
  readonly type: ParamType;
  /** Whether this is a system param (`executor`, `storage`; docs/protocol.md#what-the-resolver-checks-in-order), never the model's job. */
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
   * The model-facing schema: `definition.parameters` with the system params (and any preset
   * name) removed from `properties` and `required` (`modelParameters`). This is the schema a
   * model is shown (for example with `missing_arguments`).
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
      // `pattern` and `patternProperties` run on a linear-time engine: a pattern like
      // `^(a+)+$` would otherwise block the event loop for minutes on a 30-character string.
      code: { regExp: linearRegExp },
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
 *   compile, holds a `__proto__` key anywhere, or has a `pattern` (or `patternProperties` key)
 *   the linear-time regex engine cannot run (details `tool`, `pattern`, `reason`, `path`).
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
  const checked: Readonly<Record<string, unknown>> =
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
  const { $schema: _ignored, ...rest } = checked;
  const validationSchema: Record<string, unknown> = rest;
  if (validationProperties !== undefined) validationSchema["properties"] = validationProperties;

  return Object.freeze({
    definition: def,
    revision,
    schema: modelParameters(def),
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
    if (err instanceof UnsupportedPatternError) {
      const path = findPattern(schema, err.pattern);
      throw new ToolmeshError(
        ErrorCode.InvalidRequest,
        `tool "${tool}": its parameter schema has a pattern ${JSON.stringify(err.pattern)}${path === undefined ? "" : ` at "${path}"`} that cannot be used: ${err.reason}`,
        {
          details: {
            tool,
            pattern: err.pattern,
            reason: err.reason,
            ...(path === undefined ? {} : { path }),
          },
          cause: err,
        },
      );
    }
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

/** A `pattern` the linear-time engine cannot run (or that is not a valid ECMAScript regex). */
class UnsupportedPatternError extends Error {
  override readonly name = "UnsupportedPatternError";
  readonly pattern: string;
  readonly reason: string;

  constructor(pattern: string, reason: string, options?: ErrorOptions) {
    super(`pattern ${JSON.stringify(pattern)} cannot be used: ${reason}`, options);
    this.pattern = pattern;
    this.reason = reason;
  }
}

/** What Ajv calls a regex engine: `(pattern, flags) => { test }`, with a `code` for standalone output. */
interface RegExpEngine {
  (pattern: string, flags: string): LinearRegExp;
  code: string;
}

/** A compiled pattern; `toString` is the key Ajv caches it by. */
interface LinearRegExp {
  test(input: string): boolean;
  toString(): string;
}

/**
 * The regex engine Ajv runs `pattern` and `patternProperties` with: RE2 (re2js, pure
 * JavaScript), whose matching time is linear in the input, so no pattern can backtrack
 * catastrophically. Internal; exported for tests.
 *
 * A pattern is first checked as an ECMAScript regex with the `u` flag (as JSON Schema and Ajv
 * read it), then translated to RE2 syntax keeping ECMAScript's meaning: `\uXXXX`, `\u{…}`,
 * `\cX`, `\0`, `.` (not matching `\n`, `\r`, U+2028, U+2029), `\s` (ECMAScript's white space),
 * long Unicode property names (`\p{Letter}`, `\p{Script=Greek}`), named groups, `[]`, `[^]`.
 * One approximation: `\S` inside a character class is RE2's, which also matches the non-ASCII
 * spaces. Constructs RE2 cannot run in linear time are refused: backreferences (`\1`, `\k<n>`),
 * lookahead and lookbehind; so are Unicode properties RE2 does not know (`\p{ASCII}`, script
 * aliases such as `\p{sc=Grek}`) and repetition counts over 1000.
 *
 * @throws UnsupportedPatternError naming the pattern and the reason.
 */
export const linearRegExp: RegExpEngine = Object.assign(
  (pattern: string, flags: string): LinearRegExp => {
    if (flags !== "u" && flags !== "") {
      throw new UnsupportedPatternError(pattern, `regex flags "${flags}" are not supported`);
    }
    try {
      // Syntax only: V8 parses eagerly and compiles on first use, which never comes.
      new RegExp(pattern, "u");
    } catch (err) {
      throw new UnsupportedPatternError(
        pattern,
        `not a valid ECMAScript regular expression: ${(err as Error).message}`,
        { cause: err },
      );
    }
    let re: RE2JS;
    try {
      re = RE2JS.compile(toRe2Syntax(pattern));
    } catch (err) {
      if (!(err instanceof RE2JSException)) throw err;
      throw new UnsupportedPatternError(
        pattern,
        `the linear-time regex engine (RE2) refuses it: ${err.message}`,
        { cause: err },
      );
    }
    const source = `/${pattern}/${flags}`;
    return {
      test: (input: string) => re.test(input),
      // Ajv caches compiled patterns by this key.
      toString: () => source,
    };
  },
  // Only read when Ajv writes standalone code, which toolmesh never does.
  { code: "linearRegExp" },
);

/** ECMAScript white space and line terminators (what `\s` matches), as RE2 class contents. */
const JS_SPACE = "\\x{9}-\\x{D}\\p{Zs}\\x{2028}\\x{2029}\\x{FEFF}";

/** What ECMAScript's `.` matches without the `s` flag. */
const JS_DOT = "[^\\n\\r\\x{2028}\\x{2029}]";

/** Unicode General_Category long names (ECMAScript accepts them) to RE2's short ones. */
const GENERAL_CATEGORIES: Readonly<Record<string, string>> = {
  Letter: "L",
  Cased_Letter: "LC",
  Uppercase_Letter: "Lu",
  Lowercase_Letter: "Ll",
  Titlecase_Letter: "Lt",
  Modifier_Letter: "Lm",
  Other_Letter: "Lo",
  Mark: "M",
  Combining_Mark: "M",
  Nonspacing_Mark: "Mn",
  Spacing_Mark: "Mc",
  Enclosing_Mark: "Me",
  Number: "N",
  Decimal_Number: "Nd",
  digit: "Nd",
  Letter_Number: "Nl",
  Other_Number: "No",
  Punctuation: "P",
  punct: "P",
  Connector_Punctuation: "Pc",
  Dash_Punctuation: "Pd",
  Open_Punctuation: "Ps",
  Close_Punctuation: "Pe",
  Initial_Punctuation: "Pi",
  Final_Punctuation: "Pf",
  Other_Punctuation: "Po",
  Symbol: "S",
  Math_Symbol: "Sm",
  Currency_Symbol: "Sc",
  Modifier_Symbol: "Sk",
  Other_Symbol: "So",
  Separator: "Z",
  Space_Separator: "Zs",
  Line_Separator: "Zl",
  Paragraph_Separator: "Zp",
  Other: "C",
  Control: "Cc",
  cntrl: "Cc",
  Format: "Cf",
  Surrogate: "Cs",
  Private_Use: "Co",
  Unassigned: "Cn",
};

const hex = (codePoint: number): string => `\\x{${codePoint.toString(16).toUpperCase()}}`;

/**
 * Rewrites an ECMAScript pattern (already known to be valid with the `u` flag) in RE2 syntax
 * with the same meaning, or throws {@link UnsupportedPatternError} for what RE2 cannot do.
 * Captures are not needed (only `test` is called), so named groups become plain groups.
 */
function toRe2Syntax(pattern: string): string {
  const refuse = (reason: string): never => {
    throw new UnsupportedPatternError(pattern, reason);
  };
  let out = "";
  let inClass = false;
  let i = 0;
  while (i < pattern.length) {
    const ch = pattern[i] as string;
    if (ch === "\\") {
      const escape = re2Escape(pattern, i, inClass, refuse);
      out += escape.text;
      i = escape.end;
      continue;
    }
    if (inClass) {
      if (ch === "]") inClass = false;
      // A `[` inside a class is literal in ECMAScript; RE2 would read `[:alpha:]` as a class.
      out += ch === "[" ? "\\[" : ch;
      i += 1;
      continue;
    }
    switch (ch) {
      case "[":
        if (pattern.startsWith("[]", i)) {
          out += "[^\\x{0}-\\x{10FFFF}]";
          i += 2;
        } else if (pattern.startsWith("[^]", i)) {
          out += "[\\x{0}-\\x{10FFFF}]";
          i += 3;
        } else {
          inClass = true;
          out += pattern[i + 1] === "^" ? "[^" : "[";
          i += pattern[i + 1] === "^" ? 2 : 1;
          // A `]` right after `[` or `[^` closes the class in ECMAScript; RE2 would take it
          // literally. The `[]` and `[^]` cases are handled above, so this cannot happen.
        }
        continue;
      case ".":
        out += JS_DOT;
        i += 1;
        continue;
      case "(":
        if (pattern[i + 1] === "?") {
          const kind = pattern[i + 2];
          if (kind === "=" || kind === "!") refuse("lookahead is not supported");
          if (kind === "<" && (pattern[i + 3] === "=" || pattern[i + 3] === "!"))
            refuse("lookbehind is not supported");
          if (kind === "<") {
            out += "(?:";
            i = pattern.indexOf(">", i) + 1;
            continue;
          }
        }
        out += ch;
        i += 1;
        continue;
      default: {
        // Whole code points, so a literal astral character stays one character.
        const codePoint = pattern.codePointAt(i) ?? 0;
        const width = codePoint > 0xffff ? 2 : 1;
        out += pattern.slice(i, i + width);
        i += width;
      }
    }
  }
  return out;
}

/**
 * The RE2 form of the escape at `start` (a backslash) of an ECMAScript pattern, and where the
 * pattern goes on after it; `inClass` when it stands inside a character class.
 */
function re2Escape(
  pattern: string,
  start: number,
  inClass: boolean,
  refuse: (reason: string) => never,
): { text: string; end: number } {
  const next = pattern[start + 1] ?? "";
  let i = start + 2;
  let text = "";
  switch (next) {
    case "u": {
      let codePoint: number;
      if (pattern[i] === "{") {
        const end = pattern.indexOf("}", i);
        codePoint = Number.parseInt(pattern.slice(i + 1, end), 16);
        i = end + 1;
      } else {
        codePoint = Number.parseInt(pattern.slice(i, i + 4), 16);
        i += 4;
        const low = /^\\u([dD][c-fC-F][0-9a-fA-F]{2})/.exec(pattern.slice(i));
        if (codePoint >= 0xd800 && codePoint <= 0xdbff && low?.[1] !== undefined) {
          codePoint =
            0x10000 + ((codePoint - 0xd800) << 10) + (Number.parseInt(low[1], 16) - 0xdc00);
          i += 6;
        }
      }
      if (codePoint >= 0xd800 && codePoint <= 0xdfff) refuse("it matches a lone surrogate");
      text = hex(codePoint);
      break;
    }
    case "x":
      text = hex(Number.parseInt(pattern.slice(i, i + 2), 16));
      i += 2;
      break;
    case "c":
      text = hex((pattern.codePointAt(i) ?? 0) % 32);
      i += 1;
      break;
    case "0":
      text = hex(0);
      break;
    case "k":
      refuse("backreferences are not supported");
      break;
    case "b":
      text = inClass ? hex(8) : "\\b"; // `[\b]` is a backspace
      break;
    case "s":
      text = inClass ? JS_SPACE : `[${JS_SPACE}]`;
      break;
    case "S":
      text = inClass ? "\\S" : `[^${JS_SPACE}]`;
      break;
    case "p":
    case "P": {
      const end = pattern.indexOf("}", i);
      text = `\\${next}{${re2Property(pattern.slice(i + 1, end), refuse)}}`;
      i = end + 1;
      break;
    }
    default:
      if (next >= "1" && next <= "9") refuse("backreferences are not supported");
      // \d \D \w \W \B \f \n \r \t \v and escaped syntax characters mean the same in RE2.
      text = `\\${next}`;
  }
  return { text, end: i };
}

/** An ECMAScript Unicode property expression (`L`, `Letter`, `sc=Greek`, …) in RE2 terms. */
function re2Property(expression: string, refuse: (reason: string) => never): string {
  const [name, value] = expression.split("=", 2) as [string, string | undefined];
  if (value === undefined) return GENERAL_CATEGORIES[name] ?? name;
  if (name === "General_Category" || name === "gc") return GENERAL_CATEGORIES[value] ?? value;
  if (name === "Script" || name === "sc") return value;
  return refuse(`the Unicode property \\p{${expression}} is not supported`);
}

/**
 * Walks every object and array of a schema, depth first, each once (a schema may share a node),
 * and returns the first JSON pointer `match` gives for one, or `undefined`.
 */
function findInSchema(
  root: unknown,
  match: (node: object, path: string) => string | undefined,
): string | undefined {
  const stack: { value: unknown; path: string }[] = [{ value: root, path: "" }];
  const seen = new Set<object>();
  for (let item = stack.pop(); item !== undefined; item = stack.pop()) {
    const { value, path } = item;
    if (typeof value !== "object" || value === null || seen.has(value)) continue;
    seen.add(value);
    const found = match(value, path);
    if (found !== undefined) return found;
    for (const [key, child] of Object.entries(value)) {
      if (typeof child === "object" && child !== null)
        stack.push({ value: child, path: `${path}/${escapePointer(key)}` });
    }
  }
  return undefined;
}

/** JSON pointer of the first `pattern` or `patternProperties` key equal to `pattern`. */
function findPattern(root: unknown, pattern: string): string | undefined {
  return findInSchema(root, (value, path) => {
    if (Array.isArray(value)) return undefined;
    const node = value as Record<string, unknown>;
    if (node["pattern"] === pattern) return `${path}/pattern`;
    const keyed = node["patternProperties"];
    return isObject(keyed) && Object.hasOwn(keyed, pattern)
      ? `${path}/patternProperties/${escapePointer(pattern)}`
      : undefined;
  });
}

function escapePointer(segment: string): string {
  return segment.replaceAll("~", "~0").replaceAll("/", "~1");
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
 * Maps a property schema to the value type of `input_parameters` (docs/protocol.md#resolvedcall): the first non-`"null"` of `type` (or of
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
  return findInSchema(root, (value, path) =>
    Object.hasOwn(value, "__proto__") ? `${path}/__proto__` : undefined,
  );
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}
