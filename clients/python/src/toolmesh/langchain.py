"""LangChain tools backed by a toolmesh session (``pip install 'toolmesh[langchain]'``).

Each model tool call runs as one mesh call whose call id is the model's tool-call id, so its
idempotency key (``{session id}/{tool-call id}``) stays the same when the graph runs the same
tool call again: it runs once, and the stored answer comes back.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

try:
    from langchain_core.tools import BaseTool, ToolException
except ImportError as err:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "toolmesh.langchain needs langchain-core: pip install 'toolmesh[langchain]'"
    ) from err

from ._wire import CatalogEntry
from .client import Session
from .formats import create_name_map, describe_entry

__all__ = ["MeshTool", "langchain_tools", "to_langchain_tools"]


class MeshTool(BaseTool):
    """A mesh tool as a LangChain tool. Invoke it with a tool call (``{"name", "args", "id",
    "type": "tool_call"}``, as LangGraph's ToolNode does) to get a ``ToolMessage`` answering
    that id; a failed call becomes a tool message with ``status="error"``, for the model."""

    session: Session
    tool: str
    handle_tool_error: bool = True

    def _to_args_and_kwargs(
        self, tool_input: str | dict[str, Any], tool_call_id: str | None
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        args, kwargs = super()._to_args_and_kwargs(tool_input, tool_call_id)
        arguments = dict(kwargs)
        for value in args:
            if isinstance(value, dict):
                arguments.update(value)
        return (), {"arguments": arguments, "tool_call_id": tool_call_id}

    def _run(self, *args: Any, **kwargs: Any) -> str:
        raise NotImplementedError("toolmesh tools are asynchronous: use ainvoke")

    async def _arun(self, arguments: dict[str, Any], tool_call_id: str | None = None) -> str:
        handle = await self.session.submit(self.tool, arguments, call_id=tool_call_id)
        message = await handle.message()
        if "error" in message:
            raise ToolException(message["content"])
        return message["content"]


def to_langchain_tools(session: Session, entries: Sequence[CatalogEntry]) -> list[MeshTool]:
    """LangChain tools for catalog entries: expanded ones declare their full schema, compact
    ones a permissive one (their schema reaches the session after a first call)."""
    name_map = create_name_map((e["name"] for e in entries), "openai")
    tools: list[MeshTool] = []
    for entry in entries:
        schema = entry.get("parameters") or {
            "type": "object",
            "properties": {},
            "additionalProperties": True,
        }
        if "type" not in schema:
            schema = {"type": "object", **schema}
        tools.append(
            MeshTool(
                name=name_map.to_provider[entry["name"]],
                description=describe_entry(entry),
                args_schema=json.loads(json.dumps(schema)),
                session=session,
                tool=entry["name"],
            )
        )
    return tools


async def langchain_tools(session: Session, *, agent: str | None = None) -> list[MeshTool]:
    """The session's catalog as LangChain tools, with every schema the session received in
    full: call it again before each model turn to bind the tools expanded since."""
    catalog = await session.catalog(agent=agent)
    return to_langchain_tools(session, session.with_received_schemas(catalog["tools"]))
