"""A catalog larger than one message, read whole by the Python client: the server's max_payload
is 32 KiB, and 200 registered tools take more than one catalog page."""

from __future__ import annotations

import json
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

import toolmesh

from conftest import NatsServer, start_mesh, start_nats_server

TOOLS = 200


@pytest_asyncio.fixture(scope="module")
async def small_payload_server() -> AsyncIterator[NatsServer]:
    work = Path(tempfile.mkdtemp(prefix="toolmesh-py-pages-"))
    config = work / "server.conf"
    config.write_text(
        f"max_payload: 32768\njetstream {{ store_dir: {json.dumps(str(work / 'js'))} }}\n"
    )
    server = await start_nats_server(config=str(config))
    yield server
    await server.stop()


@pytest_asyncio.fixture(scope="module")
async def many_tools(small_payload_server: NatsServer) -> AsyncIterator[list[str]]:
    tools = Path(tempfile.mkdtemp(prefix="toolmesh-py-tools-"))
    names = [f"t{i:03d}" for i in range(TOOLS)]
    for name in names:
        definition = {
            "name": name,
            # The summary is its first sentence, cut to 120 characters: about 200 bytes a tool.
            "description": f"The tool {name}, " + "described at some length, " * 6 + "ends.",
            "parameters": {"type": "object", "properties": {}},
        }
        (tools / f"{name}.js").write_text(
            f"export default {{ ...{json.dumps(definition)}, handler: () => 'ok' }};\n"
        )
    services = await start_mesh({"NATS_URL": small_payload_server.url}, tools=tools)
    yield names
    await services.stop()


async def test_a_catalog_in_pages_is_read_whole(
    small_payload_server: NatsServer, many_tools: list[str]
) -> None:
    async with await toolmesh.connect(small_payload_server.url, default_timeout=15) as mesh:
        first = await mesh._schema_request("catalog", {})
        assert 0 < len(first["tools"]) < TOOLS
        assert first["next_cursor"] == str(len(first["tools"]))

        catalog = await mesh.catalog()
        assert [entry["name"] for entry in catalog["tools"]] == many_tools
        assert "next_cursor" not in catalog
