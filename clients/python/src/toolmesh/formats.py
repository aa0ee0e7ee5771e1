"""Catalogs as model providers' function-calling tools, and their calls read back.

The same shapes as the TypeScript client's ``formats/providers.ts`` (a test compares them):
OpenAI Chat Completions, Anthropic Messages and Gemini. Pure functions, no NATS.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ._wire import CatalogEntry, ToolCall
from .errors import InvalidRequestError

__all__ = [
    "COMPACT_SCHEMA_NOTE",
    "MAX_PROVIDER_NAME_LENGTH",
    "SUPPLEMENTED_SCHEMAS_HEADING",
    "NameMap",
    "ProviderName",
    "ProviderTools",
    "create_name_map",
    "describe_entry",
    "from_anthropic_content",
    "from_gemini_parts",
    "from_openai_tool_calls",
    "provider_safe_name",
    "render_supplemented_schemas",
    "to_anthropic_tools",
    "to_gemini_schema",
    "to_gemini_tools",
    "to_openai_tools",
    "tool_name_of",
]

ProviderName = Literal["openai", "anthropic", "gemini"]

#: Longest function name every supported provider accepts, in characters.
MAX_PROVIDER_NAME_LENGTH = 64

#: Appended to a compact entry's description: why its parameter list is empty, what follows.
COMPACT_SCHEMA_NOTE = (
    "Only a summary is shown: the full parameter schema arrives after a first call. "
    "Call it with the arguments you can infer; if required ones are missing you will get the "
    "schema."
)

_OPENAI_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_OPENAI_INVALID = re.compile(r"[^a-zA-Z0-9_-]")
_GEMINI_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_.:-]{0,63}")
_GEMINI_INVALID = re.compile(r"[^a-zA-Z0-9_.:-]")
_HASH_LENGTH = 8


@dataclass(frozen=True)
class NameMap:
    """A catalog's tool names as one provider sees them, both ways."""

    provider: ProviderName
    to_provider: Mapping[str, str]
    to_tool: Mapping[str, str]


@dataclass(frozen=True)
class ProviderTools:
    """Tools for one provider's request, and the name map to read its calls back."""

    tools: list[dict[str, Any]]
    name_map: NameMap


def provider_safe_name(name: str, provider: ProviderName = "openai") -> str:
    """A name the provider accepts as a function name (unchanged when it already does)."""
    if _is_valid_name(name, provider):
        return name
    safe = _sanitize(name, provider)
    return safe if 0 < _js_len(safe) <= MAX_PROVIDER_NAME_LENGTH else _suffixed(safe, name)


def create_name_map(names: Iterable[str], provider: ProviderName = "openai") -> NameMap:
    """The two-way name map of a catalog for one provider; sanitized names that would collide
    get a hash suffix. Raises ``InvalidRequestError`` on duplicate tool names."""
    unique: list[str] = []
    for name in names:
        if name in unique:
            raise InvalidRequestError(
                f"duplicate tool name in catalog: {name}", details={"tool": name}
            )
        unique.append(name)
    candidate = {name: provider_safe_name(name, provider) for name in unique}
    claims: dict[str, int] = {}
    for safe in candidate.values():
        claims[safe] = claims.get(safe, 0) + 1
    to_provider: dict[str, str] = {}
    to_tool: dict[str, str] = {}
    for name in unique:
        safe = candidate[name]
        chosen = (
            safe
            if safe == name or claims[safe] == 1
            else _suffixed(_sanitize(name, provider), name)
        )
        holder = to_tool.get(chosen)
        if holder is not None:
            raise InvalidRequestError(
                f"tools {holder} and {name} both map to the provider name {chosen}",
                details={"tools": [holder, name], "provider_name": chosen, "provider": provider},
            )
        to_provider[name] = chosen
        to_tool[chosen] = name
    return NameMap(provider, to_provider, to_tool)


def tool_name_of(provider_name: str, name_map: NameMap | None = None) -> str:
    """The toolmesh name of a provider-side name; unknown names are returned unchanged."""
    return name_map.to_tool.get(provider_name, provider_name) if name_map else provider_name


def describe_entry(entry: CatalogEntry) -> str:
    """Expanded: its description (else summary); compact: summary plus the compact note."""
    if "parameters" in entry:
        return entry.get("description", entry["summary"])
    summary = entry["summary"]
    return COMPACT_SCHEMA_NOTE if summary == "" else f"{summary} ({COMPACT_SCHEMA_NOTE})"


def _declared_parameters(entry: CatalogEntry) -> dict[str, Any]:
    params = entry.get("parameters")
    if params is None:
        return {"type": "object", "properties": {}, "additionalProperties": True}
    return params


def to_openai_tools(entries: Sequence[CatalogEntry]) -> ProviderTools:
    """A catalog as OpenAI Chat Completions ``tools``; compact entries get a permissive
    placeholder schema and a description saying the schema follows a first call."""
    name_map = create_name_map((e["name"] for e in entries), "openai")
    tools = [
        {
            "type": "function",
            "function": {
                "name": name_map.to_provider[e["name"]],
                "description": describe_entry(e),
                "parameters": _object_rooted(_declared_parameters(e)),
            },
        }
        for e in entries
    ]
    return ProviderTools(tools, name_map)


def to_anthropic_tools(entries: Sequence[CatalogEntry]) -> ProviderTools:
    """A catalog as Anthropic Messages ``tools``; schemas as in :func:`to_openai_tools`."""
    name_map = create_name_map((e["name"] for e in entries), "anthropic")
    tools = [
        {
            "name": name_map.to_provider[e["name"]],
            "description": describe_entry(e),
            "input_schema": _object_rooted(_declared_parameters(e)),
        }
        for e in entries
    ]
    return ProviderTools(tools, name_map)


def to_gemini_tools(entries: Sequence[CatalogEntry]) -> ProviderTools:
    """A catalog as Gemini ``tools``: one entry holding every function declaration; schemas go
    through :func:`to_gemini_schema`, and a schema without properties is left out."""
    name_map = create_name_map((e["name"] for e in entries), "gemini")
    declarations: list[dict[str, Any]] = []
    for e in entries:
        declaration: dict[str, Any] = {
            "name": name_map.to_provider[e["name"]],
            "description": describe_entry(e),
        }
        params = e.get("parameters")
        if params is not None:
            converted = to_gemini_schema(_object_rooted(params))
            if "properties" in converted:
                declaration["parameters"] = converted
        declarations.append(declaration)
    tools = [{"function_declarations": declarations}] if declarations else []
    return ProviderTools(tools, name_map)


def from_openai_tool_calls(
    tool_calls: Sequence[Mapping[str, Any]] | None, name_map: NameMap | None = None
) -> list[ToolCall]:
    """OpenAI ``message.tool_calls`` as toolmesh calls, names mapped back. String arguments
    stay as the model wrote them; an object is serialized; absent becomes ``"{}"``."""
    calls: list[ToolCall] = []
    for call in tool_calls or []:
        if call.get("type", "function") != "function":
            continue
        function = call["function"]
        args = function.get("arguments")
        calls.append(
            _tool_call(
                call["id"],
                tool_name_of(function["name"], name_map),
                args if isinstance(args, str) else _js_json(args if args is not None else {}),
            )
        )
    return calls


def from_anthropic_content(
    blocks: Sequence[Mapping[str, Any]] | None, name_map: NameMap | None = None
) -> list[ToolCall]:
    """The ``tool_use`` blocks of an Anthropic response as toolmesh calls, in order."""
    calls: list[ToolCall] = []
    for block in blocks or []:
        if block.get("type") != "tool_use":
            continue
        block_id, name = block.get("id"), block.get("name")
        if not isinstance(block_id, str) or not isinstance(name, str):
            continue
        args = block.get("input")
        calls.append(
            _tool_call(
                block_id, tool_name_of(name, name_map), _js_json(args if args is not None else {})
            )
        )
    return calls


def from_gemini_parts(
    parts: Sequence[Mapping[str, Any]] | None,
    name_map: NameMap | None = None,
    *,
    id_prefix: str = "gemini",
) -> list[ToolCall]:
    """The function calls of a Gemini candidate's parts as toolmesh calls. Calls without an
    id get ``{id_prefix}-{index}``: give each model turn its own prefix, since the default
    idempotency key derives from the call id."""
    calls: list[ToolCall] = []
    for part in parts or []:
        call = part.get("functionCall") or part.get("function_call")
        if not isinstance(call, Mapping) or not isinstance(call.get("name"), str):
            continue
        given = call.get("id")
        call_id = given if isinstance(given, str) and given else f"{id_prefix}-{len(calls)}"
        args = call.get("args")
        calls.append(
            _tool_call(
                call_id,
                tool_name_of(call["name"], name_map),
                _js_json(args if args is not None else {}),
            )
        )
    return calls


_GEMINI_FORMATS: dict[str, tuple[str, ...]] = {
    "string": ("enum", "date-time"),
    "integer": ("int32", "int64"),
    "number": ("float", "double"),
}
_COPIED_NUMBERS = (
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "minProperties",
    "maxProperties",
    "minimum",
    "maximum",
)


def to_gemini_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON Schema in Gemini's OpenAPI-3.0 subset (the rules of the TypeScript client's
    ``toGeminiSchema``: local ``$ref``s inlined, ``const`` → ``enum``, nullable types, …)."""
    return _convert(schema, schema, [])


def _convert(node: Any, root: Mapping[str, Any], refs: list[str]) -> dict[str, Any]:
    if not isinstance(node, Mapping):
        return {}
    ref = node.get("$ref")
    if isinstance(ref, str):
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        if ref in refs:
            base: dict[str, Any] = {"type": "object"}
        else:
            target = _resolve_pointer(root, ref)
            base = {} if target is None else _convert(target, root, [*refs, ref])
        return {**base, **_convert(siblings, root, refs)}
    all_of = node.get("allOf")
    if isinstance(all_of, list) and len(all_of) == 1 and isinstance(all_of[0], Mapping):
        rest = {k: v for k, v in node.items() if k != "allOf"}
        return _convert({**all_of[0], **rest}, root, refs)

    out: dict[str, Any] = {}
    nullable = node.get("nullable") is True
    variants = node.get("anyOf") if isinstance(node.get("anyOf"), list) else node.get("oneOf")
    if isinstance(variants, list):
        kept = [v for v in variants if not _is_null_schema(v)]
        if len(kept) < len(variants):
            nullable = True
        if len(kept) == 1:
            merged = _convert(kept[0], root, refs)
            if merged.get("nullable") is True:
                nullable = True
            out.update(merged)
        elif len(kept) > 1:
            out["anyOf"] = [_convert(v, root, refs) for v in kept]

    raw_type = node.get("type")
    raw_types = (
        [raw_type]
        if isinstance(raw_type, str)
        else [t for t in raw_type if isinstance(t, str)]
        if isinstance(raw_type, list)
        else None
    )
    if raw_types is not None:
        types = [t for t in raw_types if t != "null"]
        if len(types) < len(raw_types):
            nullable = True
        if len(types) == 1:
            out["type"] = types[0]
        elif len(types) > 1 and "anyOf" not in out:
            out["anyOf"] = [{"type": t} for t in types]

    if isinstance(node.get("description"), str):
        out["description"] = node["description"]

    enum_source = (
        list(node["enum"])
        if isinstance(node.get("enum"), list)
        else [node["const"]]
        if "const" in node
        else None
    )
    if enum_source is not None:
        values = [v for v in enum_source if v is not None]
        if len(values) < len(enum_source):
            nullable = True
        if all(isinstance(v, str) for v in values):
            if values:
                out["enum"] = values
                out.setdefault("type", "string")
        else:
            allowed = f"Allowed values: {', '.join(_js_json(v) for v in values)}."
            out["description"] = (
                allowed if "description" not in out else f"{out['description']} {allowed}"
            )

    fmt = node.get("format")
    if isinstance(fmt, str) and "type" in out and fmt in _GEMINI_FORMATS.get(out["type"], ()):
        out["format"] = fmt
    if isinstance(node.get("items"), Mapping):
        out["items"] = _convert(node["items"], root, refs)
    props = node.get("properties")
    if isinstance(props, Mapping) and props:
        out["properties"] = {k: _convert(v, root, refs) for k, v in props.items()}
    required = node.get("required")
    if isinstance(required, list) and "properties" in out:
        present = [r for r in required if isinstance(r, str) and r in out["properties"]]
        if present:
            out["required"] = present
    for key in _COPIED_NUMBERS:
        value = node.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[key] = value
    if isinstance(node.get("pattern"), str):
        out["pattern"] = node["pattern"]
    if nullable:
        out["nullable"] = True
    return out


def _resolve_pointer(root: Mapping[str, Any], ref: str) -> Any:
    if not ref.startswith("#"):
        return None
    pointer = urllib.parse.unquote(ref[1:])
    if pointer == "":
        return root
    if not pointer.startswith("/"):
        return None
    node: Any = root
    for raw in pointer[1:].split("/"):
        key = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, list):
            try:
                node = node[int(key)]
            except (ValueError, IndexError):
                return None
        elif isinstance(node, Mapping):
            if key not in node:
                return None
            node = node[key]
        else:
            return None
    return node


def _is_null_schema(value: Any) -> bool:
    return isinstance(value, Mapping) and value.get("type") == "null"


def _tool_call(call_id: str, name: str, args: str) -> ToolCall:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def _js_json(value: Any) -> str:
    """JSON as JavaScript's ``JSON.stringify`` writes it (compact, non-ASCII kept)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _js_len(text: str) -> int:
    """A string's length in UTF-16 code units, as JavaScript counts it."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _is_valid_name(name: str, provider: ProviderName) -> bool:
    pattern = _GEMINI_NAME if provider == "gemini" else _OPENAI_NAME
    return pattern.fullmatch(name) is not None


def _sanitize(name: str, provider: ProviderName) -> str:
    if provider != "gemini":
        return _OPENAI_INVALID.sub("_", name)
    safe = _GEMINI_INVALID.sub("_", name)
    return safe if re.match(r"[a-zA-Z_]", safe) else f"_{safe}"


def _suffixed(safe: str, original: str) -> str:
    digest = hashlib.sha256(original.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_LENGTH]
    return f"{safe[: MAX_PROVIDER_NAME_LENGTH - _HASH_LENGTH - 1]}_{digest}"


def _object_rooted(schema: Mapping[str, Any]) -> dict[str, Any]:
    return dict(schema) if "type" in schema else {"type": "object", **schema}


#: Heading of the supplemented-schemas section.
SUPPLEMENTED_SCHEMAS_HEADING = "## Supplemented tool schemas"


def render_supplemented_schemas(schemas: Sequence[Mapping[str, Any]]) -> str:
    """The "supplemented schemas" section for the next turn's system prompt, from
    ``session.take_supplemented_schemas()``: for each tool its description, the parameters its
    last call left out, its top-level parameters marked required/missing, and the full schema;
    then asks the model to call again with every required parameter. Empty input → ``""``."""
    if not schemas:
        return ""
    merged: dict[str, dict[str, Any]] = {}
    for schema in schemas:
        known = merged.get(schema["tool"])
        missing = list(schema.get("missing") or [])
        if known is None:
            merged[schema["tool"]] = {**schema, "missing": list(dict.fromkeys(missing))}
        else:
            known["missing"] = list(dict.fromkeys([*known["missing"], *missing]))
            if known.get("description") is None:
                known["description"] = schema.get("description")
    lines = [
        SUPPLEMENTED_SCHEMAS_HEADING,
        "",
        "Your last call to the tools below was incomplete, so here is each one's full parameter "
        "schema. Call the tool again with all required parameters filled in.",
    ]
    for entry in merged.values():
        lines += ["", f"### {_markdown_code(entry['tool'])}", ""]
        description = (entry.get("description") or "").strip()
        if description:
            lines += [description, ""]
        if entry["missing"]:
            named = ", ".join(_markdown_code(m) for m in entry["missing"])
            lines += [f"Missing in your last call: {named}.", ""]
        parameter_lines = _describe_parameters(entry["parameters"], entry["missing"])
        if parameter_lines:
            lines += ["Parameters:", *parameter_lines, ""]
        lines += ["Full schema:", "```json", _json_for_fence(entry["parameters"]), "```"]
    lines += [
        "",
        "Call each tool again with every required parameter; do not leave out the missing ones.",
    ]
    return "\n".join(lines)


def _describe_parameters(schema: Mapping[str, Any], missing: list[str]) -> list[str]:
    """One line per top-level parameter, then the missing names the schema does not list
    (in the order they were reported)."""
    properties = schema.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    required_list = schema.get("required")
    required = (
        {r for r in required_list if isinstance(r, str)}
        if isinstance(required_list, list)
        else set()
    )
    lines: list[str] = []
    for name, prop in properties.items():
        marks = [_type_label(prop), "**required**" if name in required else "optional"]
        if name in missing:
            marks.append("**missing**")
        if isinstance(prop, Mapping) and "default" in prop:
            marks.append(f"default {_js_json(prop['default'])}")
        description = ""
        if isinstance(prop, Mapping) and isinstance(prop.get("description"), str):
            description = " — " + re.sub(r"\s+", " ", prop["description"]).strip()
        lines.append(f"- {_markdown_code(name)} ({', '.join(marks)}){description}")
    lines += [
        f"- {_markdown_code(name)} (**required**, **missing**)"
        for name in missing
        if name not in properties
    ]
    return lines


def _type_label(prop: Any) -> str:
    if not isinstance(prop, Mapping):
        return "any"
    if isinstance(prop.get("enum"), list):
        return "one of " + ", ".join(_js_json(v) for v in prop["enum"])
    if isinstance(prop.get("type"), str):
        return str(prop["type"])
    if isinstance(prop.get("type"), list):
        return " | ".join(str(t) for t in prop["type"])
    if isinstance(prop.get("$ref"), str):
        return "see schema"
    if isinstance(prop.get("anyOf"), list) or isinstance(prop.get("oneOf"), list):
        return "see schema"
    return "any"


def _markdown_code(value: str) -> str:
    flat = re.sub(r"\s+", " ", value)
    longest = max((len(m) for m in re.findall(r"`+", flat)), default=0)
    fence = "`" * (longest + 1)
    return f"{fence}{flat}{fence}" if longest == 0 else f"{fence} {flat} {fence}"


def _json_for_fence(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False).replace("`", "\\u0060")
