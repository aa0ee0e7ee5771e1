import type { ToolCall } from "@toolmesh/protocol";
import { ErrorCode, ToolmeshError } from "@toolmesh/protocol";
import type { CatalogEntry } from "./catalog.js";
import { COMPACT_SCHEMA_NOTE, isExpanded } from "./catalog.js";

/** Options of {@link renderToolPrompt}. */
export interface ToolPromptOptions {
  /** First line of the section. Default `"## Tools"`. */
  heading?: string;
  /** Whether to explain how to make several calls in one answer. Default `true`. */
  allowMultiple?: boolean;
}

/** Options of {@link parseToolCallsFromText}. */
export interface ParseToolCallsOptions {
  /**
   * The tools the model was offered. When given, calls naming other tools are not returned
   * (a block holding only such calls stays in `text`), and an object with a known name but no
   * `parameters` key counts as a call without arguments. When absent every call-shaped object
   * is returned, so a misspelt name reaches the resolver and comes back as `unknown_tool`
   * with close matches.
   */
  knownTools?: Iterable<string>;
  /**
   * Prefix of the generated call ids: `<idPrefix>-<n>`, n counting from 0 in order of
   * appearance. Default `"fallback"`. The client derives the default idempotency key from the
   * call id, so give each model turn its own prefix (e.g. `"turn-7"`), or the second turn's
   * `fallback-0` is taken for a duplicate of the first.
   */
  idPrefix?: string;
}

/** What {@link parseToolCallsFromText} found. */
export interface ParsedToolCalls {
  /** The calls in order of appearance; `function.arguments` is always a JSON object text. */
  calls: ToolCall[];
  /** The text with the calls (and the fences that held them) taken out, trimmed. */
  text: string;
}

/**
 * Renders the structured-output fallback prompt section (README.md#tool-groups-tool-sets-agents-and-schema-expansion): how to answer with
 * a call (`{"name": …, "parameters": {…}}` in a ```json fence, or an array of those for several
 * calls), then each tool with its name, one line, and — for expanded entries — its parameter
 * schema. Compact entries are marked as getting their schema after a first call (docs/protocol.md#schema-expansion-catalog-and-tool-groups).
 * Whitespace in summaries is collapsed to keep each on one line; backticks inside schemas are
 * written as `\u0060` so no schema can close its fence. No entries → `""`.
 */
export function renderToolPrompt(
  entries: readonly CatalogEntry[],
  options: ToolPromptOptions = {},
): string {
  if (entries.length === 0) return "";
  const lines: string[] = [
    options.heading ?? "## Tools",
    "",
    "You can call the tools listed below. To call a tool, answer with a JSON object in a " +
      "```json fence:",
    "",
    "```json",
    '{"name": "<tool name>", "parameters": {"<parameter>": "<value>"}}',
    "```",
  ];
  if (options.allowMultiple ?? true) {
    lines.push(
      "",
      "To call several tools at once, put a JSON array of such objects in one fence:",
      "",
      "```json",
      '[{"name": "<tool name>", "parameters": {}}, {"name": "<other tool>", "parameters": {}}]',
      "```",
    );
  }
  lines.push(
    "",
    'Use the tool names exactly as listed. Always include "parameters" (`{}` when there are ' +
      "none). Write strict JSON: double quotes, no comments, no trailing commas. When no tool " +
      "is needed, answer normally.",
  );
  if (entries.some((entry) => !isExpanded(entry))) {
    lines.push(
      "",
      `Tools marked "schema on first call" show only a summary. ${COMPACT_SCHEMA_NOTE}`,
    );
  }
  for (const entry of entries) {
    const expanded = isExpanded(entry);
    lines.push("", `### ${markdownCode(entry.name)}${expanded ? "" : " (schema on first call)"}`);
    const line = oneLine(expanded ? (entry.description ?? entry.summary) : entry.summary);
    if (line !== "") lines.push("", line);
    if (entry.parameters !== undefined) {
      lines.push("", "Parameters (JSON Schema):", "```json", jsonForFence(entry.parameters), "```");
    }
  }
  return lines.join("\n");
}

/**
 * Reads tool calls out of a model's structured-output answer. Looks in, in order of appearance:
 * - ```json fences: the content must be one JSON value or several separated by whitespace;
 * - untagged ``` fences whose content starts with `{` or `[`, read the same way;
 * - JSON objects and arrays embedded in prose, found by a balanced-bracket scan that respects
 *   JSON strings and escapes. Fences tagged with another language are left alone.
 *
 * A call is an object with a string `name` (or `tool`, `tool_name`) and a `parameters` (or
 * `arguments`) key holding an object, a JSON string of an object, or null; or the OpenAI
 * shape `{"function": {"name", "arguments"}}`. An array of calls is several calls. Other
 * keys (`id`, `type`, …) are ignored; ids are assigned as `<idPrefix>-<n>`.
 *
 * Valid JSON that is not a call (`{"answer": 42}`, `[1, 2]`) is not a call: it stays in
 * `text`, fenced or not. Prose without calls gives `{ calls: [] }`.
 *
 * Nothing is repaired or guessed: the function throws `invalid_arguments` with details
 * `{ snippet, position, reason, line, column }` (`position` is the 0-based offset in `text`
 * where the offending JSON starts; `line`/`column` are 1-based) when
 * - a ```json fence does not hold strict JSON (truncated, trailing comma, comments, text
 *   after the value);
 * - an untagged fence or a prose span that looks like a call (`{"name":`, `{'name':`,
 *   `{name:`, or name and parameters keys) is not strict JSON — Python dicts included;
 * - one block mixes calls with other values;
 * - a call's arguments are not an object (or a JSON string of one), or it has both
 *   `parameters` and `arguments`.
 */
export function parseToolCallsFromText(
  text: string,
  options: ParseToolCallsOptions = {},
): ParsedToolCalls {
  const known = options.knownTools === undefined ? undefined : new Set(options.knownTools);
  const parser = new CallTextParser(text, known);
  parser.run();
  const prefix = options.idPrefix ?? "fallback";
  const calls = parser.found.map((call, index): ToolCall => ({
    id: `${prefix}-${index}`,
    type: "function",
    function: { name: call.name, arguments: call.arguments },
  }));
  return { calls, text: parser.prose() };
}

/** Inline markdown code for `value`, safe when it contains backticks or line breaks. */
export function markdownCode(value: string): string {
  const flat = value.replace(/\s+/g, " ");
  const longestRun = Math.max(0, ...Array.from(flat.matchAll(/`+/g), (m) => m[0].length));
  const fence = "`".repeat(longestRun + 1);
  return longestRun === 0 ? `${fence}${flat}${fence}` : `${fence} ${flat} ${fence}`;
}

/**
 * Pretty JSON that cannot close a markdown fence: backticks only occur inside JSON strings,
 * where `\u0060` means the same character.
 */
export function jsonForFence(value: unknown): string {
  return JSON.stringify(value, null, 2).replaceAll("`", "\\u0060");
}

function oneLine(value: string): string {
  return value.replace(/\s+/g, " ").trim();
}

interface FoundCall {
  name: string;
  arguments: string;
}

interface Span {
  start: number;
  end: number;
}

interface JsonValueAt extends Span {
  value: unknown;
}

interface Fence extends Span {
  lang: string;
  contentStart: number;
  contentEnd: number;
}

const NAME_KEYS = ["name", "tool", "tool_name"] as const;
const CALL_LIKE_START = /^\[?\s*\{\s*(["']?)(?:name|tool|tool_name|function)\1\s*:/;
const OBJECT_START = /^\[?\s*\{\s*(["']?)[\w$-]+\1\s*:/;
const NAME_KEY = /(["']?)\b(?:name|tool|tool_name)\1\s*:/;
const ARGS_KEY = /(["']?)\b(?:parameters|arguments)\1\s*:/;
const SNIPPET_LENGTH = 200;
const KEY_SEARCH_LENGTH = 4_096;

/**
 * Whether unparsable text clearly tries to be a call, so failing beats ignoring it: it opens
 * with a name key (`{"name":`, `{'name':`, `{name:`, also inside `[`), or it opens an object
 * with some key and has both a name key and a parameters key before its first nested `{`
 * (and within 4,096 characters). Prose that merely contains a call (`{ see {"name": …} }`)
 * does not open with a key, so the scan moves on and finds the inner call.
 */
function looksLikeCall(candidate: string): boolean {
  if (CALL_LIKE_START.test(candidate)) return true;
  if (!OBJECT_START.test(candidate)) return false;
  // Only the object's own leading keys count (up to the next `{`), so garbage around a nested
  // call is not mistaken for a call; bounded, so a long run of nested unclosed objects is not
  // searched once per opener.
  const nested = candidate.indexOf("{", candidate.indexOf("{") + 1);
  const head = candidate.slice(0, Math.min(nested === -1 ? Infinity : nested, KEY_SEARCH_LENGTH));
  return NAME_KEY.test(head) && ARGS_KEY.test(head);
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/**
 * Finds where a JSON object or array starting at an opener ends, counting brackets outside
 * JSON strings. Results are memoized for every opener met outside a string during a scan:
 * from such an opener a fresh scan would go through exactly the same states, so a run of
 * unclosed brackets costs one pass instead of one pass per bracket.
 */
class BracketScanner {
  readonly #text: string;
  readonly #limit: number;
  readonly #endOf = new Map<number, number>();

  constructor(text: string, limit: number) {
    this.#text = text;
    this.#limit = limit;
  }

  /** Exclusive end of the bracketed span starting at `start`, or -1 when it never closes. */
  endOf(start: number): number {
    const memo = this.#endOf.get(start);
    if (memo !== undefined) return memo;
    const text = this.#text;
    const stack: number[] = [];
    let inString = false;
    let escaped = false;
    for (let i = start; i < this.#limit; i++) {
      const ch = text[i];
      if (inString) {
        if (escaped) escaped = false;
        else if (ch === "\\") escaped = true;
        else if (ch === '"') inString = false;
      } else if (ch === '"') {
        inString = true;
      } else if (ch === "{" || ch === "[") {
        stack.push(i);
      } else if (ch === "}" || ch === "]") {
        const open = stack.pop();
        if (open !== undefined) this.#endOf.set(open, i + 1);
        if (stack.length === 0) return i + 1;
      }
    }
    for (const open of stack) this.#endOf.set(open, -1);
    return -1;
  }
}

class CallTextParser {
  readonly found: FoundCall[] = [];
  readonly #text: string;
  readonly #known: ReadonlySet<string> | undefined;
  readonly #removed: Span[] = [];

  constructor(text: string, known: ReadonlySet<string> | undefined) {
    this.#text = text;
    this.#known = known;
  }

  run(): void {
    let cursor = 0;
    for (const fence of this.#fences()) {
      this.#scanProse(cursor, fence.start);
      this.#readFence(fence);
      cursor = fence.end;
    }
    this.#scanProse(cursor, this.#text.length);
  }

  /** The text without the removed spans, joined so that no gap is left behind. */
  prose(): string {
    let out = "";
    let cursor = 0;
    for (const span of this.#removed) {
      out = joinProse(out, this.#text.slice(cursor, span.start));
      cursor = span.end;
    }
    return joinProse(out, this.#text.slice(cursor)).trim();
  }

  /**
   * Markdown fences of three or more backticks. A fence closes at the next run of at least as
   * many backticks that ends a line, whether alone on it or glued to the last content line
   * (JSON strings cannot hold raw line breaks, so a run inside one never ends a line). An
   * inline fence (```{…}``` or ```json {…}``` on one line) closes at the next such run anywhere.
   * An unclosed fence (a truncated answer) runs to the end of the text.
   */
  *#fences(): Generator<Fence> {
    const text = this.#text;
    const opener = /`{3,}/g;
    let match: RegExpExecArray | null;
    while ((match = opener.exec(text)) !== null) {
      const start = match.index;
      const run = match[0].length;
      const afterRun = start + run;
      const lineEnd = text.indexOf("\n", afterRun);
      const info = text.slice(afterRun, lineEnd === -1 ? text.length : lineEnd);
      let lang: string;
      let contentStart: number;
      let closer: RegExp;
      if (/^[\w.+-]*\s*$/.test(info)) {
        lang = info.trim().toLowerCase();
        contentStart = lineEnd === -1 ? text.length : lineEnd + 1;
        closer = new RegExp(`\`{${run},}[ \\t]*\\r?$`, "gm");
      } else {
        const tag = /^([\w.+-]+)[ \t]+(?=[{[])/.exec(info);
        lang = tag?.[1]?.toLowerCase() ?? "";
        contentStart = afterRun + (tag?.[0].length ?? 0);
        closer = new RegExp(`\`{${run},}`, "g");
      }
      closer.lastIndex = contentStart;
      const close = closer.exec(text);
      const contentEnd = close === null ? text.length : close.index;
      const end = close === null ? text.length : close.index + close[0].length;
      yield { start, end, lang, contentStart, contentEnd };
      opener.lastIndex = end;
    }
  }

  #readFence(fence: Fence): void {
    const content = this.#text.slice(fence.contentStart, fence.contentEnd);
    const trimmed = content.trimStart();
    const tagged = fence.lang === "json";
    if (!tagged && (fence.lang !== "" || !/^[{[]/.test(trimmed))) return;
    const values = this.#parseSequence(fence.contentStart, fence.contentEnd, tagged);
    if (values === undefined || values.length === 0) return;
    if (this.#takeCalls(values)) this.#removed.push({ start: fence.start, end: fence.end });
  }

  /**
   * Parses `[start, end)` as whitespace-separated JSON values. On invalid JSON: throws when
   * `strict` or when the bad part looks like a call; otherwise returns undefined.
   */
  #parseSequence(start: number, end: number, strict: boolean): JsonValueAt[] | undefined {
    const text = this.#text;
    const content = text.slice(start, end);
    if (content.trim() === "") return [];
    const whole = tryParse(content);
    if (whole.ok) {
      const first = start + (content.length - content.trimStart().length);
      return [{ value: whole.value, start: first, end }];
    }
    // Not one value: maybe several in a row, each an object or array.
    const scanner = new BracketScanner(text, end);
    const values: JsonValueAt[] = [];
    let i = start;
    for (;;) {
      while (i < end && /\s/.test(text[i] ?? "")) i++;
      if (i >= end) return values;
      const ch = text[i];
      let candidate: string;
      let reason: string;
      if (ch === "{" || ch === "[") {
        const close = scanner.endOf(i);
        candidate = text.slice(i, close === -1 ? end : close);
        const parsed = tryParse(candidate);
        if (parsed.ok && close !== -1) {
          values.push({ value: parsed.value, start: i, end: close });
          i = close;
          continue;
        }
        reason = parsed.ok ? "Unexpected end of JSON input" : parsed.reason;
      } else {
        candidate = text.slice(i, end);
        reason =
          values.length === 0
            ? whole.reason
            : "unexpected text after a JSON value (separate calls with whitespace only, " +
              "or put them in one array)";
      }
      if (strict || looksLikeCall(candidate)) throw this.#error(i, candidate, reason);
      return undefined;
    }
  }

  /** Scans prose for embedded JSON objects and arrays. */
  #scanProse(start: number, end: number): void {
    const text = this.#text;
    const scanner = new BracketScanner(text, end);
    let i = start;
    while (i < end) {
      const ch = text[i];
      if (ch !== "{" && ch !== "[") {
        i++;
        continue;
      }
      const close = scanner.endOf(i);
      const candidate = text.slice(i, close === -1 ? end : close);
      // An unclosed span is never parsed unless it is reported: parsing every nested opener of
      // a long unclosed run would cost a pass each.
      const parsed = close === -1 ? tryParseLater : tryParse(candidate);
      if (!parsed.ok) {
        if (looksLikeCall(candidate)) throw this.#error(i, candidate, failureOf(candidate));
        i++;
        continue;
      }
      if (this.#takeCalls([{ value: parsed.value, start: i, end: close }])) {
        this.#removed.push({ start: i, end: close });
      }
      i = close;
    }
  }

  /**
   * Records the calls among `values` (arrays are flattened one level). Returns whether the
   * values were calls, i.e. whether their text should leave the prose: true when at least one
   * call was kept; false for non-call JSON, or when `knownTools` filtered out every call.
   */
  #takeCalls(values: readonly JsonValueAt[]): boolean {
    const items: { value: unknown; at: JsonValueAt }[] = [];
    for (const at of values) {
      if (Array.isArray(at.value)) for (const value of at.value) items.push({ value, at });
      else items.push({ value: at.value, at });
    }
    const shaped = items.filter((item) => this.#isCallShaped(item.value));
    if (shaped.length === 0) return false;
    if (shaped.length < items.length) {
      const at = values[0] ?? { start: 0, end: 0 };
      const last = values[values.length - 1] ?? at;
      throw this.#error(
        at.start,
        this.#text.slice(at.start, last.end),
        "a JSON block mixes tool calls with other values",
      );
    }
    let kept = 0;
    for (const { value, at } of shaped) {
      const call = this.#toCall(value as Record<string, unknown>, at);
      if (this.#known !== undefined && !this.#known.has(call.name)) continue;
      this.found.push(call);
      kept++;
    }
    return kept > 0;
  }

  #isCallShaped(value: unknown): boolean {
    if (!isRecord(value)) return false;
    if (isRecord(value.function) && nameOf(value.function) !== undefined) return true;
    const name = nameOf(value);
    if (name === undefined) return false;
    return "parameters" in value || "arguments" in value || this.#known?.has(name) === true;
  }

  #toCall(value: Record<string, unknown>, at: JsonValueAt): FoundCall {
    const source =
      isRecord(value.function) && nameOf(value.function) !== undefined ? value.function : value;
    const name = nameOf(source) ?? "";
    const snippet = (): string => this.#text.slice(at.start, at.end);
    if ("parameters" in source && "arguments" in source) {
      throw this.#error(
        at.start,
        snippet(),
        `call to ${name} has both "parameters" and "arguments"`,
      );
    }
    const args = "parameters" in source ? source.parameters : source.arguments;
    if (args === undefined || args === null) return { name, arguments: "{}" };
    if (isRecord(args)) return { name, arguments: JSON.stringify(args) };
    if (typeof args === "string") {
      let parsed: unknown;
      try {
        parsed = JSON.parse(args);
      } catch (err) {
        throw this.#error(
          at.start,
          snippet(),
          `arguments of ${name} are a string that is not JSON: ${errorMessage(err)}`,
        );
      }
      if (isRecord(parsed)) return { name, arguments: args.trim() };
    }
    throw this.#error(at.start, snippet(), `arguments of ${name} are not a JSON object`);
  }

  #error(position: number, candidate: string, reason: string): ToolmeshError {
    const before = this.#text.slice(0, position);
    const line = before.split("\n").length;
    const column = position - (before.lastIndexOf("\n") + 1) + 1;
    const snippet =
      candidate.length <= SNIPPET_LENGTH ? candidate : `${candidate.slice(0, SNIPPET_LENGTH)}…`;
    return new ToolmeshError(
      ErrorCode.InvalidArguments,
      `tool call in the model's answer is not valid JSON (line ${line}, column ${column}): ${reason}`,
      { details: { snippet, position, reason, line, column } },
    );
  }
}

function nameOf(value: Record<string, unknown>): string | undefined {
  for (const key of NAME_KEYS) {
    const name = value[key];
    if (typeof name === "string" && name !== "") return name;
  }
  return undefined;
}

/** Stands for "not parsed yet": the span is unclosed, so it cannot be valid JSON. */
const tryParseLater = { ok: false, reason: "" } as const;

/** Why `json` is not valid JSON, in the parser's words. */
function failureOf(json: string): string {
  const parsed = tryParse(json);
  return parsed.ok ? "Unexpected end of JSON input" : parsed.reason;
}

function tryParse(json: string): { ok: true; value: unknown } | { ok: false; reason: string } {
  try {
    return { ok: true, value: JSON.parse(json) as unknown };
  } catch (err) {
    return { ok: false, reason: errorMessage(err) };
  }
}

/** Joins two pieces of prose around a removed span without leaving a hole. */
function joinProse(left: string, right: string): string {
  const a = left.replace(/[ \t]+$/, "");
  const b = right.replace(/^[ \t]+/, "");
  if (a === "" || b === "") return a + b;
  const brokeLine = /\n\s*$/.test(a) || /^\s*\n/.test(b);
  return brokeLine ? `${a.trimEnd()}\n\n${b.trimStart()}` : `${a} ${b}`;
}
