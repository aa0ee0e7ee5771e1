"""The schema-expansion loop: compact tools, an incomplete call, the schema, a complete call."""

from __future__ import annotations

import json
import uuid

import toolmesh


async def test_the_schema_expansion_loop(mesh: toolmesh.Mesh) -> None:
    async with mesh.session(f"py-{uuid.uuid4().hex[:12]}") as session:
        catalog = await session.catalog()
        compact = toolmesh.to_openai_tools(catalog["tools"])
        inspect = next(t for t in compact.tools if t["function"]["name"] == "inspect")
        assert inspect["function"]["parameters"]["properties"] == {}

        # The model calls with what it could infer; the mesh answers with what is missing
        # and sends the full schema to the session.
        first = await (await session.submit("inspect", {"limit": 2})).message()
        assert first.get("error", {}).get("code") == "missing_arguments"
        assert await session.wait_for_schema("inspect", timeout=10)
        supplements = session.take_supplemented_schemas()
        assert [(s["tool"], s["missing"]) for s in supplements] == [("inspect", ["query"])]
        section = toolmesh.render_supplemented_schemas(supplements)
        assert "- `query` (string, **required**, **missing**)" in section
        assert session.take_supplemented_schemas() == []

        # The next turn declares the tool in full.
        expanded = toolmesh.to_openai_tools(session.with_received_schemas(catalog["tools"]))
        inspect = next(t for t in expanded.tools if t["function"]["name"] == "inspect")
        assert inspect["function"]["parameters"]["required"] == ["query"]
        again = await session.call("inspect", {"query": "now complete", "limit": 2})
        assert json.loads(again["content"])["args"]["query"] == "now complete"

        # The catalog now lists it expanded; describe and expand answer on request.
        later = await session.catalog()
        entry = next(e for e in later["tools"] if e["name"] == "inspect")
        assert "parameters" in entry
        described = await session.describe(["slow", "nope"])
        assert [s["tool"] for s in described["schemas"]] == ["slow"]
        assert described["errors"][0]["error"]["code"] == "unknown_tool"
        schema = await session.expand("counter")
        assert schema["tool"] == "counter"
        assert await session.wait_for_schema("counter", timeout=10)


async def test_a_catalog_of_provider_safe_names(mesh: toolmesh.Mesh) -> None:
    async with mesh.session(f"py-{uuid.uuid4().hex[:12]}") as session:
        plain = await session.catalog()
        safe = await session.catalog(names="provider_safe")
    assert [entry.get("tool") for entry in safe["tools"]] == [e["name"] for e in plain["tools"]]
    for entry in safe["tools"]:
        assert entry["name"] == toolmesh.provider_safe_name(entry["tool"])
    assert all("tool" not in entry for entry in plain["tools"])
    tenant = await mesh.catalog(names="provider_safe")
    assert {entry["name"] for entry in tenant["tools"]} >= {"echo", "inspect"}
