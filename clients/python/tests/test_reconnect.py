"""Reconnect catch-up: a result published while the connection was down is read from the
sessions stream after the reconnect."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

import toolmesh

from conftest import NatsServer, TcpProxy


@contextlib.asynccontextmanager
async def _behind_proxy(
    nats_server: NatsServer, **options: Any
) -> AsyncIterator[tuple[TcpProxy, toolmesh.Mesh]]:
    """A frontend connected through a proxy whose link the test can cut."""
    proxy = TcpProxy(nats_server.port)
    await proxy.start()
    frontend = await toolmesh.connect(
        f"nats://127.0.0.1:{proxy.port}", reconnect_time_wait=0.1, default_timeout=20, **options
    )
    try:
        yield proxy, frontend
    finally:
        await frontend.close()
        await proxy.close()


async def _stored_while_away(
    mesh: toolmesh.Mesh, frontend: toolmesh.Mesh, proxy: TcpProxy, call_id: str
) -> toolmesh.CallHandle:
    """Submits a slow call, cuts the frontend's link once it runs and waits until the mesh has
    stored its result: only a read of the sessions stream can deliver it now."""
    session_id = f"py-{call_id}-{uuid.uuid4().hex[:8]}"
    handle = await frontend.session(session_id).submit(
        "slow", {"ms": 700, "steps": 1}, call_id=call_id
    )
    async for _ in handle.progress():
        break  # running: accepted and stored
    proxy.cut()
    stored = None
    for _ in range(200):
        stored = await mesh._last_stored(mesh.subjects.result(session_id, call_id))
        if stored is not None:
            break
        await asyncio.sleep(0.05)
    assert stored is not None, "the mesh did not store the result"
    assert not handle._pending.future.done()
    return handle


async def test_a_result_published_while_disconnected_arrives_after_the_reconnect(
    nats_server: NatsServer, mesh: toolmesh.Mesh
) -> None:
    async with _behind_proxy(nats_server) as (proxy, frontend):
        handle = await _stored_while_away(mesh, frontend, proxy, "rc-1")
        proxy.restore()
        message = await asyncio.wait_for(handle.result(), 15)
        assert json.loads(message["content"]) == {"slept": 700}


async def test_a_failed_first_read_after_the_reconnect_is_tried_again(
    nats_server: NatsServer, mesh: toolmesh.Mesh
) -> None:
    js = mesh.nc.jetstream()
    stream = mesh.subjects.sessions_stream

    async def direct_reads(allowed: bool) -> None:
        config = (await js.stream_info(stream)).config
        config.allow_direct = allowed
        await js.update_stream(config)

    # Reads that find no responder fail at once on a current server and time out on 2.9.
    async with _behind_proxy(nats_server, request_timeout=0.5) as (proxy, frontend):
        try:
            handle = await _stored_while_away(mesh, frontend, proxy, "rf-1")
            # Unreadable by direct get when the frontend comes back: its first reads fail.
            await direct_reads(False)
            proxy.restore()
            # Long enough for both reads of the catch-up (the submission's rejection, then its
            # result) to fail, also where a read waited 2 s for its answer.
            await asyncio.sleep(4.5)
            assert not handle._pending.future.done()
            await direct_reads(True)
            message = await asyncio.wait_for(handle.result(), 15)
            assert json.loads(message["content"]) == {"slept": 700}
        finally:
            await direct_reads(True)


async def test_a_duplicate_puback_is_answered_from_the_store(
    nats_server: NatsServer, mesh: toolmesh.Mesh, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two submissions under one message id: the second is what a frontend sends again when the
    # first one's PubAck was lost. The stream drops it, so nothing answers it live.
    fixed = uuid.uuid4()
    monkeypatch.setattr("toolmesh.client.uuid.uuid4", lambda: fixed)
    session_id = f"py-dup-{uuid.uuid4().hex[:8]}"
    async with mesh.session(session_id) as first:
        message = await first.call("counter", {"label": "dup"}, call_id="dup-1")
    again = await toolmesh.connect(nats_server.url)
    async with again, again.session(session_id) as second:
        handle = await second.submit("counter", {"label": "dup"}, call_id="dup-1", timeout=5)
        answer = await asyncio.wait_for(handle.result(), 10)
    assert answer["content"] == message["content"]
