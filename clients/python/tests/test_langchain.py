"""LangChain tools over a session: tool calls in, tool messages out, one run per tool-call id."""

from __future__ import annotations

import json
import uuid

import pytest

import toolmesh

pytest.importorskip("langchain_core")

from langchain_core.messages import ToolMessage

from toolmesh.langchain import langchain_tools


async def test_langchain_tools_keep_one_key_per_tool_call_id(mesh: toolmesh.Mesh) -> None:
    async with mesh.session(f"py-lc-{uuid.uuid4().hex[:8]}") as session:
        tools = {tool.name: tool for tool in await langchain_tools(session)}
        counter = tools["counter"]
        call = {"name": "counter", "args": {"label": "lc"}, "id": "lc-1", "type": "tool_call"}
        first = await counter.ainvoke(call)
        assert isinstance(first, ToolMessage)
        assert first.tool_call_id == "lc-1"
        again = await counter.ainvoke(call)  # the graph ran the same tool call again
        assert json.loads(str(again.content)) == json.loads(str(first.content))
        other = await counter.ainvoke({**call, "id": "lc-2"})
        assert json.loads(str(other.content))["runs"] > json.loads(str(first.content))["runs"]


async def test_an_incomplete_call_is_an_error_message_and_expands_the_tool(
    mesh: toolmesh.Mesh,
) -> None:
    async with mesh.session(f"py-lc-{uuid.uuid4().hex[:8]}") as session:
        tools = {tool.name: tool for tool in await langchain_tools(session)}
        assert "query" not in tools["inspect"].args  # compact: no schema yet
        answer = await tools["inspect"].ainvoke(
            {"name": "inspect", "args": {"limit": 1}, "id": "lc-3", "type": "tool_call"}
        )
        assert answer.status == "error"
        assert "query" in str(answer.content)
        assert await session.wait_for_schema("inspect", timeout=10)
        expanded = {tool.name: tool for tool in await langchain_tools(session)}
        assert "query" in expanded["inspect"].args
        done = await expanded["inspect"].ainvoke(
            {"name": "inspect", "args": {"query": "q"}, "id": "lc-4", "type": "tool_call"}
        )
        assert done.status == "success"
        assert json.loads(str(done.content))["args"]["query"] == "q"
