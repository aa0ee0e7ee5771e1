"""Reconnect catch-up: a result published while the connection was down is read from the
sessions stream after the reconnect."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

import toolmesh

from conftest import NatsServer, TcpProxy


async def test_a_result_published_while_disconnected_arrives_after_the_reconnect(
    nats_server: NatsServer, mesh: toolmesh.Mesh
) -> None:
    proxy = TcpProxy(nats_server.port)
    await proxy.start()
    frontend = await toolmesh.connect(
        f"nats://127.0.0.1:{proxy.port}",
        reconnect_time_wait=0.1,
        default_timeout=20,
    )
    session_id = f"py-rc-{uuid.uuid4().hex[:8]}"
    try:
        session = frontend.session(session_id)
        handle = await session.submit("slow", {"ms": 700, "steps": 1}, call_id="rc-1")
        async for _ in handle.progress():
            break  # running: accepted and stored
        proxy.cut()
        # The result is stored while this frontend cannot hear it.
        stored = None
        for _ in range(200):
            stored = await mesh._last_stored(mesh.subjects.result(session_id, "rc-1"))
            if stored is not None:
                break
            await asyncio.sleep(0.05)
        assert stored is not None, "the mesh did not store the result"
        assert not handle._pending.future.done()
        proxy.restore()
        message = await asyncio.wait_for(handle.result(), 15)
        assert json.loads(message["content"]) == {"slept": 700}
    finally:
        await frontend.close()
        await proxy.close()


async def test_a_failed_first_read_after_the_reconnect_is_tried_again(
    nats_server: NatsServer, mesh: toolmesh.Mesh
) -> None:
    proxy = TcpProxy(nats_server.port)
    await proxy.start()
    # Reads that find no responder fail at once on a current server and time out on 2.9.
    frontend = await toolmesh.connect(
        f"nats://127.0.0.1:{proxy.port}",
        reconnect_time_wait=0.1,
        default_timeout=20,
        request_timeout=0.5,
    )
    js = mesh.nc.jetstream()
    stream = mesh.subjects.sessions_stream
    session_id = f"py-rf-{uuid.uuid4().hex[:8]}"

    async def direct_reads(allowed: bool) -> None:
        config = (await js.stream_info(stream)).config
        config.allow_direct = allowed
        await js.update_stream(config)

    try:
        session = frontend.session(session_id)
        handle = await session.submit("slow", {"ms": 700, "steps": 1}, call_id="rf-1")
        async for _ in handle.progress():
            break  # running: accepted and stored
        proxy.cut()
        stored = None
        for _ in range(200):
            stored = await mesh._last_stored(mesh.subjects.result(session_id, "rf-1"))
            if stored is not None:
                break
            await asyncio.sleep(0.05)
        assert stored is not None, "the mesh did not store the result"
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
        await frontend.close()
        await proxy.close()


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
