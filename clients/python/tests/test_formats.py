"""Provider formats: the same output as the TypeScript client's, compared in one run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import toolmesh
from toolmesh import formats

REPO = Path(__file__).resolve().parents[3]

CATALOG: list[dict[str, Any]] = [
    {"name": "echo", "summary": "Returns the text.", "groups": ["default"], "revision": 1},
    {
        "name": "mcp.github.create_issue",
        "summary": "Opens an issue.",
        "groups": ["dev"],
        "revision": 2,
        "description": "Opens an issue in a repository.",
        "parameters": {
            "type": "object",
            "$defs": {"Label": {"type": "string", "enum": ["bug", "feature"]}},
            "properties": {
                "title": {"type": "string", "minLength": 1},
                "labels": {"type": "array", "items": {"$ref": "#/$defs/Label"}},
                "priority": {"type": ["integer", "null"], "enum": [1, 2, 3, None]},
                "when": {"type": "string", "format": "date-time"},
                "meta": {"anyOf": [{"type": "object"}, {"type": "null"}]},
                "kind": {"const": "issue"},
            },
            "required": ["title", "missing_one"],
            "additionalProperties": False,
        },
    },
    {"name": "mcp:github:create_issue", "summary": "", "groups": [], "revision": 3},
    {"name": "9lives", "summary": "Starts with a digit.", "groups": [], "revision": 1},
    {"name": "x" * 70, "summary": "Too long a name.", "groups": [], "revision": 1},
    {"name": "天气", "summary": "Weather.", "groups": [], "revision": 1},
    {"name": "nested", "summary": "s", "groups": [], "revision": 1, "parameters": {}},
]

CALLS: dict[str, list[dict[str, Any]]] = {
    "openai": [
        {"id": "a", "type": "function", "function": {"name": "echo", "arguments": '{"x":1}'}},
        {"id": "b", "type": "custom", "function": {"name": "echo"}},
        {"id": "c", "function": {"name": "mcp_github_create_issue", "arguments": {"t": "é"}}},
        {"id": "d", "function": {"name": "echo"}},
    ],
    "anthropic": [
        {"type": "text", "text": "hi"},
        {"type": "tool_use", "id": "tu1", "name": "echo", "input": {"text": "hi"}},
        {"type": "tool_use", "id": "tu2", "name": "echo"},
    ],
    "gemini": [
        {"text": "thinking"},
        {"functionCall": {"name": "echo", "args": {"text": "hi"}}},
        {"function_call": {"name": "echo", "id": "g7"}},
    ],
}

SUPPLEMENTED: list[dict[str, Any]] = [
    {
        "tool": "mcp.github.create_issue",
        "parameters": CATALOG[1]["parameters"],
        "missing": ["title", "missing_one"],
        "description": "Opens an issue.\n  In a `repo`.",
    },
    {"tool": "mcp.github.create_issue", "parameters": {}, "missing": ["title", "body"]},
    {
        "tool": "odd `name`",
        "parameters": {"properties": {"n": {"default": 3, "description": "How\n many"}}},
    },
]

TS = r"""
import * as c from "@toolmesh/client";
const { catalog, calls, supplemented } = JSON.parse(process.argv[1]);
const plain = (p) => ({ tools: p.tools, map: [...p.nameMap.toProvider.entries()] });
const openai = c.toOpenAITools(catalog);
const anthropic = c.toAnthropicTools(catalog);
const gemini = c.toGeminiTools(catalog);
console.log(JSON.stringify({
  openai: plain(openai), anthropic: plain(anthropic), gemini: plain(gemini),
  from_openai: c.fromOpenAIToolCalls(calls.openai, openai.nameMap),
  from_anthropic: c.fromAnthropicContent(calls.anthropic, anthropic.nameMap),
  from_gemini: c.fromGeminiParts(calls.gemini, gemini.nameMap, { idPrefix: "turn-1" }),
  supplemented: c.renderSupplementedSchemas(supplemented),
  safe: ["a.b", "a b", "-x", "x".repeat(80)].map((n) => [
    c.providerSafeName(n, "openai"),
    c.providerSafeName(n, "gemini"),
  ]),
}));
"""


def typescript() -> dict[str, Any]:
    out = subprocess.run(
        [
            "node",
            "--input-type=module",
            "-e",
            TS,
            json.dumps({"catalog": CATALOG, "calls": CALLS, "supplemented": SUPPLEMENTED}),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def plain(tools: formats.ProviderTools) -> dict[str, Any]:
    return {"tools": tools.tools, "map": [list(p) for p in tools.name_map.to_provider.items()]}


def test_the_same_provider_formats_as_the_typescript_client() -> None:
    ts = typescript()
    entries: Any = CATALOG
    openai = toolmesh.to_openai_tools(entries)
    anthropic = toolmesh.to_anthropic_tools(entries)
    gemini = toolmesh.to_gemini_tools(entries)
    assert plain(openai) == ts["openai"]
    assert plain(anthropic) == ts["anthropic"]
    assert plain(gemini) == ts["gemini"]
    assert toolmesh.from_openai_tool_calls(CALLS["openai"], openai.name_map) == ts["from_openai"]
    assert (
        toolmesh.from_anthropic_content(CALLS["anthropic"], anthropic.name_map)
        == ts["from_anthropic"]
    )
    assert (
        toolmesh.from_gemini_parts(CALLS["gemini"], gemini.name_map, id_prefix="turn-1")
        == ts["from_gemini"]
    )
    assert toolmesh.render_supplemented_schemas(SUPPLEMENTED) == ts["supplemented"]
    assert toolmesh.render_supplemented_schemas([]) == ""
    safe = [
        [formats.provider_safe_name(n, "openai"), formats.provider_safe_name(n, "gemini")]
        for n in ["a.b", "a b", "-x", "x" * 80]
    ]
    assert safe == ts["safe"]
