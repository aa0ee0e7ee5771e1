"""The README's examples, run against the test mesh."""

from __future__ import annotations

import asyncio
import os
import re
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

import toolmesh

from conftest import NatsServer

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


async def test_the_first_example_runs(
    nats_server: NatsServer, mesh: toolmesh.Mesh, tmp_path: Path
) -> None:
    script = tmp_path / "example.py"
    script.write_text(python_blocks()[0])
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        env={**os.environ, "NATS_URL": nats_server.url},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    assert out.decode().splitlines() == ["hi from Python", "missing_arguments False ['text']"]


async def test_the_langchain_example_runs(mesh: toolmesh.Mesh) -> None:
    pytest.importorskip("langchain_core")
    from langchain_core.messages import AIMessage

    namespace: dict[str, Any] = {"toolmesh": toolmesh}
    exec(python_blocks()[-1], namespace)
    ai = AIMessage(
        content="",
        tool_calls=[{"name": "echo", "args": {"text": "from LangChain"}, "id": "readme-1"}],
    )
    async with mesh.session(f"py-readme-{uuid.uuid4().hex[:8]}") as session:
        answers = await namespace["answer_tool_calls"](session, ai)
    assert [(a.tool_call_id, a.content) for a in answers] == [("readme-1", "from LangChain")]
