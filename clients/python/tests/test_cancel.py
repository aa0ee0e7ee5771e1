"""Cancelling the asyncio task that awaits a call cancels the call in the mesh."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

import toolmesh
from toolmesh import CallCancelledError

from conftest import MeshServices, NatsServer, start_mesh

# A call long enough that only its cancellation can end it within a test.
LONG_MS = 60_000


def sid() -> str:
    return f"py-cancel-{uuid.uuid4().hex[:10]}"


async def started(session: toolmesh.Session, call_id: str) -> None:
    """Waits for the first progress event of a call: its tool is running."""
    async for event in session.events():
        if event.type == "progress" and event.body.get("tool_call_id") == call_id:
            return


async def cancel_once_started(session: toolmesh.Session, call_id: str) -> None:
    """Awaits the call in a task, cancels the task once the tool runs, and checks the task
    ended cancelled."""
    running = asyncio.ensure_future(started(session, call_id))
    await asyncio.sleep(0)  # the listener is subscribed before the call goes out
    task = asyncio.create_task(session.call("slow", {"ms": LONG_MS, "steps": 1}, call_id=call_id))
    await asyncio.wait_for(running, 20)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_cancelling_the_awaiting_task_aborts_the_running_call(mesh: toolmesh.Mesh) -> None:
    async with mesh.session(sid()) as session:
        await cancel_once_started(session, "cancel-running")
        # The same call id again, at once: the call's own state, not a refusal.
        begun = time.monotonic()
        with pytest.raises(CallCancelledError):
            await session.call("slow", {"ms": LONG_MS, "steps": 1}, call_id="cancel-running")
        assert time.monotonic() - begun < 10  # far below the tool's minute: it was aborted
        reply = await session.cancel("cancel-running")
        assert reply["state"] == "done"


async def test_a_timeout_around_the_call_cancels_it(mesh: toolmesh.Mesh) -> None:
    async with mesh.session(sid()) as session:
        handle = await session.submit("slow", {"ms": 200, "steps": 1}, call_id="warm")
        await handle  # the tool is loaded: the next call starts within the timeout below
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(
                session.call("slow", {"ms": LONG_MS, "steps": 1}, call_id="cancel-timeout"), 1.5
            )
        with pytest.raises(CallCancelledError):
            await session.call("slow", {"ms": LONG_MS, "steps": 1}, call_id="cancel-timeout")


async def test_a_call_that_ended_first_keeps_its_result(mesh: toolmesh.Mesh) -> None:
    async with mesh.session(sid()) as session:
        task = asyncio.create_task(session.call("counter", {"label": "ended"}, call_id="ended"))
        message = await task
        task.cancel()  # too late: nothing to cancel
        again = await session.call("counter", {"label": "ended"}, call_id="ended")
        assert json.loads(again["content"]) == json.loads(message["content"])


@pytest_asyncio.fixture(scope="module")
async def one_slot_mesh(nats_server: NatsServer) -> AsyncIterator[MeshServices]:
    """A mesh of its own (prefix ``pyslot``) whose executor runs one call at a time, so a call
    can wait in the mesh, accepted and routed but not started."""
    services = await start_mesh(
        {
            "NATS_URL": nats_server.url,
            "TOOLMESH_PREFIX": "pyslot",
            "TOOLMESH_CONCURRENCY": "1",
            "TOOLMESH_LOG_LEVEL": "debug",
        }
    )
    yield services
    await services.stop()


async def test_a_call_cancelled_before_it_starts_never_runs(
    nats_server: NatsServer, one_slot_mesh: MeshServices
) -> None:
    async with (
        await toolmesh.connect(nats_server.url, prefix="pyslot", default_timeout=90) as slot,
        slot.session(sid()) as session,
    ):
        running = asyncio.ensure_future(started(session, "holder"))
        await asyncio.sleep(0)
        holder = await session.submit("slow", {"ms": LONG_MS, "steps": 1}, call_id="holder")
        await asyncio.wait_for(running, 20)  # the one slot is taken

        task = asyncio.create_task(session.call("counter", {"label": "never"}, call_id="never"))
        await one_slot_mesh.wait_for(
            lambda line: (
                line.get("msg") == "call routed to its executors" and line.get("callId") == "never"
            ),
            20,
        )
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(CallCancelledError):
            await session.call("counter", {"label": "never"}, call_id="never")

        assert (await holder.cancel())["state"] == "cancelled"
        after = await session.call("counter", {"label": "after"}, call_id="after")
        # The executor's first run of the counter: the cancelled call never ran.
        assert json.loads(after["content"]) == {"label": "after", "runs": 1}
