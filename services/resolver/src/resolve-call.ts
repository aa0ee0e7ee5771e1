import {
  ErrorCode,
  MAX_ARGUMENT_DEPTH,
  MAX_TOOL_NAME_LENGTH,
  ToolmeshError,
  nestsDeeperThan,
  idempotencyKeyOf,
} from "@toolmesh/protocol";
import type {
  CallRequest,
  InputParameter,
  ParamType,
  ResolvedCall,
  SessionAddress,
} from "@toolmesh/protocol";
import type { CompiledParam, CompiledTool, ErrorObject } from "@toolmesh/registry";

/** Characters of input shown on each side of a JSON syntax error in `details.snippet`. */
const SNIPPET_RADIUS = 20;

/** Errors spelled out in an `invalid_parameters` message; the rest are only counted. */
const ERRORS_IN_MESSAGE = 3;

/**
 * Turns `function.arguments` into the arguments object. A string is parsed as JSON, and an
 * empty or whitespace-only string means `{}` (as OpenAI sends for a tool without params); an
 * object is used as it is, not copied. JSON.parse keeps `__proto__` and `constructor` keys as
 * ordinary own data properties.
 *
 * @throws ToolmeshError `invalid_arguments`: not JSON (details `position`, `line`, `column`,
 *   `snippet`, `reason`), or JSON that is not an object (details `received`: the JSON type).
 */
export function parseArguments(raw: unknown): Record<string, unknown> {
  if (typeof raw !== "string") return requireShallow(requireObject(raw));
  if (/^\s*$/.test(raw)) return {};
  let parsed: unknown;
  try {
    parsed = JSON.parse(raw);
  } catch (err) {
    throw notJsonError(raw, err);
  }
  return requireShallow(requireObject(parsed));
}

// Deeper values would overflow the stack of every later JSON.stringify on the way.
function requireShallow(args: Record<string, unknown>): Record<string, unknown> {
  if (nestsDeeperThan(args, MAX_ARGUMENT_DEPTH)) {
    throw new ToolmeshError(
      ErrorCode.InvalidArguments,
      `function.arguments nest deeper than ${MAX_ARGUMENT_DEPTH} levels`,
      { details: { max_depth: MAX_ARGUMENT_DEPTH } },
    );
  }
  return args;
}

function requireObject(value: unknown): Record<string, unknown> {
  if (typeof value === "object" && value !== null && !Array.isArray(value))
    return value as Record<string, unknown>;
  const received = jsonTypeOf(value);
  throw new ToolmeshError(
    ErrorCode.InvalidArguments,
    `function.arguments must be a JSON object, got ${received === "array" ? "an array" : received}`,
    { details: { received } },
  );
}

function notJsonError(text: string, err: unknown): ToolmeshError {
  const { position, reason } = scanJsonError(text);
  const { line, column } = lineAndColumn(text, position);
  const snippet = text.slice(Math.max(0, position - SNIPPET_RADIUS), position + SNIPPET_RADIUS);
  return new ToolmeshError(
    ErrorCode.InvalidArguments,
    `function.arguments is not valid JSON (line ${line}, column ${column}): ${reason}`,
    { details: { position, line, column, snippet, reason }, cause: err },
  );
}

/** 1-based line and column of an offset; lines end at `\n`. */
export function lineAndColumn(text: string, position: number): { line: number; column: number } {
  let line = 1;
  let lineStart = 0;
  for (let i = text.indexOf("\n"); i !== -1 && i < position; i = text.indexOf("\n", i + 1)) {
    line += 1;
    lineStart = i + 1;
  }
  return { line, column: position - lineStart + 1 };
}

/** Where JSON text goes wrong, described in the mesh's own words (never a parser's). */
export interface JsonSyntaxProblem {
  /** Offset (UTF-16 code units) of the first character that cannot be JSON. */
  position: number;
  /** What is wrong there. */
  reason: string;
}

/** Object keys leading to a string value (`"[]"` for an array element). */
type JsonPath = readonly string[];

/**
 * The first syntax error in text JSON.parse rejected, found by a scan of our own so that the
 * answer neither depends on the engine's wording nor repeats it. Iterative, so deeply nested
 * input cannot overflow the stack; only used on the error path. `onString` sees every string
 * value before the error with the keys leading to it, so fields of a broken body can be read.
 */
export function scanJsonError(
  text: string,
  onString?: (path: JsonPath, value: string) => void,
): JsonSyntaxProblem {
  return new JsonErrorScan(text, onString).run();
}

const isDigit = (ch: string | undefined): boolean => ch !== undefined && ch >= "0" && ch <= "9";

/** One pass of {@link scanJsonError} over a text: where it is, and what it expects next. */
class JsonErrorScan {
  readonly #end: number;
  readonly #containers: { kind: "{" | "["; key: string }[] = [];
  #i = 0;
  #expect: "value" | "key" | "after" = "value";

  constructor(
    private readonly text: string,
    private readonly onString?: (path: JsonPath, value: string) => void,
  ) {
    this.#end = text.length;
  }

  run(): JsonSyntaxProblem {
    for (;;) {
      this.#skipSpace();
      const failed =
        this.#expect === "value"
          ? this.#value()
          : this.#expect === "key"
            ? this.#key()
            : this.#after();
      if (failed !== undefined) return failed;
    }
  }

  /** A value at `i`: opens a container, or moves past a scalar. */
  #value(): JsonSyntaxProblem | undefined {
    const { text } = this;
    const ch = text[this.#i];
    if (ch === "{" || ch === "[") {
      this.#i += 1;
      this.#skipSpace();
      if (text[this.#i] === (ch === "{" ? "}" : "]")) {
        this.#i += 1;
        this.#expect = "after";
      } else {
        this.#containers.push({ kind: ch, key: "" });
        this.#expect = ch === "{" ? "key" : "value";
      }
      return undefined;
    }
    let failed: JsonSyntaxProblem | undefined;
    if (ch === '"') {
      const from = this.#i;
      failed = this.#skipString();
      if (failed === undefined && this.onString !== undefined)
        this.onString(this.#path(), this.#decoded(from));
    } else if (ch === "-" || isDigit(ch)) failed = this.#skipNumber();
    else failed = this.#skipLiteral(ch);
    if (failed !== undefined) return failed;
    this.#expect = "after";
    return undefined;
  }

  /** A property name at `i`, then its colon. */
  #key(): JsonSyntaxProblem | undefined {
    const { text } = this;
    if (text[this.#i] !== '"') return this.#unexpected(this.#i, "a double-quoted property name");
    const from = this.#i;
    const failed = this.#skipString();
    if (failed !== undefined) return failed;
    const top = this.#containers[this.#containers.length - 1];
    if (top !== undefined && this.onString !== undefined) top.key = this.#decoded(from);
    this.#skipSpace();
    if (text[this.#i] !== ":") return this.#unexpected(this.#i, "':' after a property name");
    this.#i += 1;
    this.#expect = "value";
    return undefined;
  }

  /** After a value: a comma, the end of its container, or the end of the text. */
  #after(): JsonSyntaxProblem | undefined {
    const { text } = this;
    const top = this.#containers[this.#containers.length - 1];
    if (top === undefined) {
      // A complete value, then something else (or nothing, when the parser failed on
      // something this scan does not check).
      return this.#i < this.#end
        ? this.#problem(this.#i, `text after the JSON value: ${JSON.stringify(text[this.#i])}`)
        : { position: this.#end, reason: "not a JSON value" };
    }
    const close = top.kind === "{" ? "}" : "]";
    if (text[this.#i] === ",") {
      this.#i += 1;
      this.#expect = top.kind === "{" ? "key" : "value";
    } else if (text[this.#i] === close) {
      this.#i += 1;
      this.#containers.pop();
    } else {
      return this.#unexpected(this.#i, `',' or '${close}'`);
    }
    return undefined;
  }

  #problem(position: number, reason: string): JsonSyntaxProblem {
    return {
      position: Math.min(position, this.#end),
      reason: position >= this.#end ? "the text ends before the JSON value does" : reason,
    };
  }

  #unexpected(at: number, wanted: string): JsonSyntaxProblem {
    return this.#problem(at, `expected ${wanted}, found ${JSON.stringify(this.text[at] ?? "")}`);
  }

  #skipSpace(): void {
    const { text } = this;
    while (
      this.#i < this.#end &&
      (text[this.#i] === " " ||
        text[this.#i] === "\t" ||
        text[this.#i] === "\n" ||
        text[this.#i] === "\r")
    )
      this.#i += 1;
  }

  /** Moves past a string at `i`; returns its problem, or undefined. */
  #skipString(): JsonSyntaxProblem | undefined {
    const { text } = this;
    this.#i += 1;
    while (this.#i < this.#end) {
      const c = text.charCodeAt(this.#i);
      if (c === 0x22) {
        this.#i += 1;
        return undefined;
      }
      if (c < 0x20) return this.#problem(this.#i, "a control character inside a string");
      if (c === 0x5c) {
        const failed = this.#skipEscape();
        if (failed !== undefined) return failed;
      } else {
        this.#i += 1;
      }
    }
    return this.#problem(this.#end, "");
  }

  /** Moves past the escape (a backslash) at `i` in a string; returns its problem, or undefined. */
  #skipEscape(): JsonSyntaxProblem | undefined {
    const { text } = this;
    const escaped = text[this.#i + 1];
    if (escaped === "u") {
      for (let k = 2; k < 6; k += 1)
        if (!/[0-9a-fA-F]/.test(text[this.#i + k] ?? ""))
          return this.#problem(this.#i + k, "a bad \\u escape");
      this.#i += 6;
    } else if (escaped !== undefined && '"\\/bfnrt'.includes(escaped)) {
      this.#i += 2;
    } else {
      return this.#problem(this.#i + 1, "a bad escape in a string");
    }
    return undefined;
  }

  /** Moves past a number at `i`; returns its problem, or undefined. */
  #skipNumber(): JsonSyntaxProblem | undefined {
    const { text } = this;
    if (text[this.#i] === "-") this.#i += 1;
    if (text[this.#i] === "0") this.#i += 1;
    else if (isDigit(text[this.#i])) while (isDigit(text[this.#i])) this.#i += 1;
    else return this.#unexpected(this.#i, "a digit");
    if (text[this.#i] === ".") {
      this.#i += 1;
      if (!isDigit(text[this.#i])) return this.#unexpected(this.#i, "a digit");
      while (isDigit(text[this.#i])) this.#i += 1;
    }
    if (text[this.#i] === "e" || text[this.#i] === "E") {
      this.#i += 1;
      if (text[this.#i] === "+" || text[this.#i] === "-") this.#i += 1;
      if (!isDigit(text[this.#i])) return this.#unexpected(this.#i, "a digit");
      while (isDigit(text[this.#i])) this.#i += 1;
    }
    return undefined;
  }

  /** Moves past `true`, `false` or `null` starting with `ch`; returns its problem, or undefined. */
  #skipLiteral(ch: string | undefined): JsonSyntaxProblem | undefined {
    const literal = ch === "t" ? "true" : ch === "f" ? "false" : ch === "n" ? "null" : undefined;
    if (literal === undefined) return this.#unexpected(this.#i, "a JSON value");
    for (const expected of literal) {
      if (this.text[this.#i] !== expected)
        return this.#unexpected(this.#i, `the literal ${literal}`);
      this.#i += 1;
    }
    return undefined;
  }

  #path(): JsonPath {
    return this.#containers.map((c) => (c.kind === "{" ? c.key : "[]"));
  }

  #decoded(from: number): string {
    return JSON.parse(this.text.slice(from, this.#i)) as string;
  }
}

/** Fields of a call request read from a body that is not JSON, as far as the body goes. */
export interface CallIdsInBrokenBody {
  toolCallId?: string;
  tool?: string;
  sessionId?: string;
}

/**
 * Reads `tool_call.id`, `tool_call.function.name` and `session_id` from the part of a call
 * request before its first syntax error, so a broken call can be answered on its own id.
 * Values longer than 256 characters are not taken.
 */
export function readCallIds(text: string): CallIdsInBrokenBody {
  const found: CallIdsInBrokenBody = {};
  scanJsonError(text, (path, value) => {
    if (value.length === 0 || value.length > 256) return;
    const at = path.join("\u0000");
    if (at === "tool_call\u0000id") found.toolCallId ??= value;
    else if (at === "tool_call\u0000function\u0000name") found.tool ??= value;
    else if (at === "session_id") found.sessionId ??= value;
  });
  return found;
}

/**
 * Up to `max` (default 3) candidates close to `name`, for `unknown_tool`: compared without
 * case, by Damerau-Levenshtein distance within about a third of the longer name's length,
 * plus candidates that contain the name or are contained in it (both at least 3 characters).
 * Ordered by distance, then by name (code units), so the result is deterministic.
 */
export function findCloseMatches(name: string, candidates: Iterable<string>, max = 3): string[] {
  if (max <= 0) return [];
  const query = name.toLowerCase();
  const hits: { name: string; distance: number }[] = [];
  const seen = new Set<string>();
  for (const candidate of candidates) {
    if (seen.has(candidate)) continue;
    seen.add(candidate);
    const lower = candidate.toLowerCase();
    const threshold = Math.max(1, Math.floor(Math.max(query.length, lower.length) / 3));
    const contains =
      Math.min(query.length, lower.length) >= 3 && (lower.includes(query) || query.includes(lower));
    if (!contains && Math.abs(query.length - lower.length) > threshold) continue;
    const distance = editDistance(query, lower);
    if (contains || distance <= threshold) hits.push({ name: candidate, distance });
  }
  hits.sort((a, b) => a.distance - b.distance || (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  return hits.slice(0, max).map((hit) => hit.name);
}

/** Optimal-string-alignment distance: insertions, deletions, substitutions, adjacent swaps. */
function editDistance(a: string, b: string): number {
  if (a === b) return 0;
  const width = b.length + 1;
  let before = new Array<number>(width).fill(0);
  let previous = Array.from({ length: width }, (_, j) => j);
  let current = new Array<number>(width).fill(0);
  for (let i = 1; i <= a.length; i += 1) {
    current[0] = i;
    for (let j = 1; j <= b.length; j += 1) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let best = Math.min(
        (previous[j] ?? 0) + 1,
        (current[j - 1] ?? 0) + 1,
        (previous[j - 1] ?? 0) + cost,
      );
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) {
        best = Math.min(best, (before[j - 2] ?? 0) + 1);
      }
      current[j] = best;
    }
    [before, previous, current] = [previous, current, before];
  }
  return previous[b.length] ?? 0;
}

/**
 * Refuses tool names no tool can have: longer than {@link MAX_TOOL_NAME_LENGTH} (128)
 * characters, empty, or holding control characters (U+0000–U+001F, U+007F). Names with `.`,
 * `*`, `>` or spaces pass: they are merely unknown unless registered, and map to safe tokens.
 *
 * @throws ToolmeshError `invalid_request`
 */
export function validateToolName(name: string): void {
  const shown = JSON.stringify(name.length > 64 ? `${name.slice(0, 64)}…` : name);
  if (name.length === 0) {
    throw new ToolmeshError(ErrorCode.InvalidRequest, "the tool name is empty", {
      details: { length: 0 },
    });
  }
  if (name.length > MAX_TOOL_NAME_LENGTH) {
    throw new ToolmeshError(
      ErrorCode.InvalidRequest,
      `tool name ${shown} is ${name.length} characters long; at most ${MAX_TOOL_NAME_LENGTH} are allowed`,
      { details: { length: name.length, max_length: MAX_TOOL_NAME_LENGTH } },
    );
  }
  // eslint-disable-next-line no-control-regex -- control characters are what we look for
  const control = /[\u0000-\u001f\u007f]/.exec(name);
  if (control !== null) {
    throw new ToolmeshError(
      ErrorCode.InvalidRequest,
      `tool name ${shown} contains a control character`,
      {
        details: { position: control.index, code_point: control[0].charCodeAt(0) },
      },
    );
  }
}

/** Options of {@link resolveCall}. */
export interface ResolveCallOptions {
  /** The resolver's clock, epoch ms. */
  now: number;
  /** Budget of a call that sets no `timeout_ms`, in ms. */
  defaultTimeoutMs: number;
  /** Where the call's answers go (tenant and session tokens). */
  address: SessionAddress;
}

/** One entry of `invalid_parameters` `details.errors`. */
export interface ParameterError {
  /** JSON pointer into the arguments ("" is the arguments object itself). */
  path: string;
  /** The JSON Schema keyword that failed. */
  keyword: string;
  message: string;
  /** What the keyword wanted: type(s), allowed values, format, bound, pattern, property name… */
  expected: unknown;
  /** The value found at `path`; `undefined` when there is none. */
  received: unknown;
}

const NO_EDGES: ReadonlySet<string> = new Set();

/**
 * Resolves a call against a compiled tool (docs/protocol.md#what-the-resolver-checks-in-order): fills schema defaults into `args` in
 * place (nested ones too; values the model gave are never replaced), lists missing params,
 * validates, and builds the `input_parameters` of a workflow node. System params are the
 * system's to fill: values the model gave for them are dropped from `args` before anything
 * else, and they are skipped everywhere; edge-connected params (`request.edge_params`) count
 * as present.
 *
 * @throws ToolmeshError `missing_arguments` when required params are absent (details `tool`,
 *   `missing_required`, `missing_optional`, `parameters`: the model-facing schema), else
 *   `invalid_parameters` when the arguments fail the schema (details `tool`, `errors`).
 */
export function resolveCall(
  tool: CompiledTool,
  request: CallRequest,
  args: Record<string, unknown>,
  options: ResolveCallOptions,
): ResolvedCall {
  const name = tool.definition.name;
  const { properties, systemParams } = tool;
  const edges =
    request.edge_params !== undefined && request.edge_params.length > 0
      ? new Set(request.edge_params)
      : NO_EDGES;

  for (const name of systemParams) if (Object.hasOwn(args, name)) delete args[name];
  const given = properties.map((param) => isPresent(args, param.name));
  fillInheritedDefaults(properties, args);

  const valid = tool.validate(args);
  const ajvErrors = valid ? null : tool.validate.errors;

  const missingRequired: string[] = [];
  const missingOptional: string[] = [];
  for (const param of properties) {
    if (param.system || edges.has(param.name) || isPresent(args, param.name)) continue;
    (param.required ? missingRequired : missingOptional).push(param.name);
  }
  if (missingRequired.length > 0) {
    throw new ToolmeshError(
      ErrorCode.MissingArguments,
      `tool "${name}" is missing required argument${missingRequired.length === 1 ? "" : "s"}: ${missingRequired.join(", ")}`,
      {
        details: {
          tool: name,
          missing_required: missingRequired,
          missing_optional: missingOptional,
          parameters: tool.schema,
        },
      },
    );
  }

  if (ajvErrors !== null && ajvErrors !== undefined) {
    const errors = parameterErrors(ajvErrors, args, systemParams, edges);
    if (errors.length > 0) throw invalidParameters(name, errors);
  }

  const inputParameters = inputParametersOf(properties, args, given, edges);

  const timeoutMs = request.timeout_ms ?? options.defaultTimeoutMs;
  const resolved: ResolvedCall = {
    call_id: request.tool_call.id,
    tool_call_id: request.tool_call.id,
    idempotency_key: idempotencyKeyOf(request, request.tool_call.id),
    session_id: request.session_id,
    address: { tenant: options.address.tenant, session: options.address.session },
    tool: name,
    arguments: args,
    missing_required: missingRequired,
    missing_optional: missingOptional,
    input_parameters: inputParameters,
    context: request.context ?? {},
    agent_context: request.agent_context ?? {},
    timeout_ms: timeoutMs,
    deadline_at: options.now + timeoutMs,
    resolved_at: options.now,
    tool_revision: tool.revision,
  };
  if (request.agent !== undefined) resolved.agent = request.agent;
  if (request.identity !== undefined) resolved.identity = request.identity;
  if (request.attempt_timeout_ms !== undefined)
    resolved.attempt_timeout_ms = request.attempt_timeout_ms;
  return resolved;
}

/**
 * Fills the defaults of params whose name an inherited member holds, which Ajv cannot fill.
 * Ajv tests `args[name] === undefined`, which sees Object.prototype: it would never fill a
 * param named `constructor` or `toString`, and would validate the inherited member.
 */
function fillInheritedDefaults(
  properties: readonly CompiledParam[],
  args: Record<string, unknown>,
): void {
  for (const param of properties) {
    if (
      !param.system &&
      param.hasDefault &&
      !Object.hasOwn(args, param.name) &&
      param.name in args
    ) {
      Object.defineProperty(args, param.name, {
        value: structuredClone(param.default),
        writable: true,
        enumerable: true,
        configurable: true,
      });
    }
  }
}

/**
 * The `input_parameters` of a workflow node: where each non-system param's value comes from
 * (an edge, the model's arguments, a default, or its type's zero value). `given` tells, by
 * index, which params the model gave before defaults were filled.
 */
function inputParametersOf(
  properties: readonly CompiledParam[],
  args: Record<string, unknown>,
  given: readonly boolean[],
  edges: ReadonlySet<string>,
): InputParameter[] {
  const inputParameters: InputParameter[] = [];
  properties.forEach((param, index) => {
    if (param.system) return;
    const entry = { name: param.name, type: param.type };
    if (edges.has(param.name)) {
      inputParameters.push({ ...entry, value: "", source: "edge" });
    } else if (given[index] === true) {
      inputParameters.push({ ...entry, value: args[param.name], source: "tool_args" });
    } else if (param.hasDefault && param.default !== null) {
      // The filled value, not the schema's: it is a fresh copy with nested defaults filled.
      const value = Object.hasOwn(args, param.name) ? args[param.name] : param.default;
      inputParameters.push({ ...entry, value, source: "default" });
    } else {
      inputParameters.push({ ...entry, value: zeroValue(param.type), source: "zero_value" });
    }
  });
  return inputParameters;
}

function isPresent(args: Record<string, unknown>, name: string): boolean {
  return Object.hasOwn(args, name) && args[name] !== undefined;
}

/** The zero value of a type (docs/protocol.md#what-the-resolver-checks-in-order): a fresh object or array each time. */
function zeroValue(type: ParamType): unknown {
  switch (type) {
    case "str":
      return "";
    case "int":
    case "float":
      return 0;
    case "bool":
      return false;
    case "list":
      return [];
    case "dict":
      return {};
  }
}

/** Ajv errors as wire errors; those about system or edge-connected params are dropped. */
function parameterErrors(
  ajvErrors: readonly ErrorObject[],
  args: Record<string, unknown>,
  systemParams: ReadonlySet<string>,
  edges: ReadonlySet<string>,
): ParameterError[] {
  const errors: ParameterError[] = [];
  for (const error of ajvErrors) {
    const params = error.params as Record<string, unknown>;
    const child = childProperty(error.keyword, params);
    const path =
      child === undefined ? error.instancePath : `${error.instancePath}/${escapePointer(child)}`;
    const segments = path === "" ? [] : path.slice(1).split("/").map(unescapePointer);
    const top = segments[0];
    if (top !== undefined && (systemParams.has(top) || edges.has(top))) continue;
    errors.push({
      path,
      keyword: error.keyword,
      message: describe(error, child),
      expected: expectedOf(error.keyword, params),
      received: valueAt(args, segments),
    });
  }
  return errors;
}

/** For keywords that are about one property of an object: that property's name. */
function childProperty(keyword: string, params: Record<string, unknown>): string | undefined {
  const name =
    keyword === "required" || keyword === "dependentRequired" || keyword === "dependencies"
      ? params["missingProperty"]
      : keyword === "additionalProperties"
        ? params["additionalProperty"]
        : keyword === "unevaluatedProperties"
          ? params["unevaluatedProperty"]
          : undefined;
  return typeof name === "string" ? name : undefined;
}

function expectedOf(keyword: string, params: Record<string, unknown>): unknown {
  switch (keyword) {
    case "type":
      return params["type"];
    case "enum":
      return params["allowedValues"];
    case "const":
      return params["allowedValue"];
    case "format":
      return params["format"];
    case "pattern":
      return params["pattern"];
    case "multipleOf":
      return params["multipleOf"];
    case "minimum":
    case "maximum":
    case "exclusiveMinimum":
    case "exclusiveMaximum":
    case "minLength":
    case "maxLength":
    case "minItems":
    case "maxItems":
    case "minProperties":
    case "maxProperties":
    case "minContains":
    case "maxContains":
      return params["limit"];
    case "required":
    case "dependentRequired":
    case "dependencies":
      return params["missingProperty"];
    case "additionalProperties":
      return params["additionalProperty"];
    case "unevaluatedProperties":
      return params["unevaluatedProperty"];
    case "propertyNames":
      return params["propertyName"];
    default:
      return Object.keys(params).length > 0 ? params : undefined;
  }
}

function describe(error: ErrorObject, child: string | undefined): string {
  if (child !== undefined) {
    return error.keyword === "required" ||
      error.keyword === "dependentRequired" ||
      error.keyword === "dependencies"
      ? "is required"
      : "is not allowed";
  }
  return error.message ?? `fails "${error.keyword}"`;
}

function invalidParameters(tool: string, errors: ParameterError[]): ToolmeshError {
  const shown = errors
    .slice(0, ERRORS_IN_MESSAGE)
    .map(
      (e) =>
        `${e.path === "" ? "the arguments" : e.path} ${e.message}${e.keyword === "type" ? ` (got ${jsonTypeOf(e.received)})` : ""}`,
    );
  const more = errors.length - shown.length;
  return new ToolmeshError(
    ErrorCode.InvalidParameters,
    `invalid arguments for tool "${tool}": ${shown.join("; ")}${more > 0 ? `; and ${more} more` : ""}`,
    { details: { tool, errors } },
  );
}

/** The value at a JSON pointer's segments, through own properties only. */
function valueAt(root: unknown, segments: readonly string[]): unknown {
  let current: unknown = root;
  for (const segment of segments) {
    if (Array.isArray(current)) {
      current = /^(0|[1-9]\d*)$/.test(segment) ? current[Number(segment)] : undefined;
    } else if (typeof current === "object" && current !== null && Object.hasOwn(current, segment)) {
      current = (current as Record<string, unknown>)[segment];
    } else {
      return undefined;
    }
  }
  return current;
}

function escapePointer(segment: string): string {
  return segment.replaceAll("~", "~0").replaceAll("/", "~1");
}

function unescapePointer(segment: string): string {
  return segment.replaceAll("~1", "/").replaceAll("~0", "~");
}

function jsonTypeOf(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "array";
  return typeof value;
}
