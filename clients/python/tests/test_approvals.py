"""Calls that wait for their caller (``@approval("caller")``): the session's ``approval``
event, and ``Session.confirm`` confirming (the call runs once) or declining
(``ApprovalDeniedError``, the tool never ran)."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

import toolmesh
from toolmesh import ApprovalDeniedError, ToolMessage

from conftest import REPO, MeshServices, NatsServer, start_mesh

PREFIX = "pyapprove"
POLICY = """@id("all")
permit (principal, action, resource);

@id("counter-confirmed")
@approval("caller")
permit (principal, action == Toolmesh::Action::"call", resource == Toolmesh::Tool::"counter")
when { context.args has label && context.args.label like "confirm-*" };
"""


def sid() -> str:
    return f"py-approve-{uuid.uuid4().hex[:10]}"


async def toolmesh_cli(nats_url: str, *args: str) -> None:
    process = await asyncio.create_subprocess_exec(
        "node",
        str(REPO / "bin" / "toolmesh.js"),
        *args,
        cwd=str(REPO),
        env={"PATH": os.environ.get("PATH", ""), "NATS_URL": nats_url, "TOOLMESH_PREFIX": PREFIX},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await process.communicate()
    assert process.returncode == 0, err.decode(errors="replace")


@pytest_asyncio.fixture(scope="module")
async def approvals_mesh(nats_server: NatsServer) -> AsyncIterator[MeshServices]:
    """A mesh of its own (prefix ``pyapprove``) under a policy set that makes ``counter``
    calls labelled ``confirm-*`` wait for their caller."""
    policy = Path(tempfile.mkdtemp(prefix="toolmesh-py-policy-")) / "policy.cedar"
    policy.write_text(POLICY)
    await toolmesh_cli(nats_server.url, "policy", "set", str(policy))
    services = await start_mesh({"NATS_URL": nats_server.url, "TOOLMESH_PREFIX": PREFIX})
    await services.wait_for(lambda line: line.get("msg") == "policy set applied", timeout=60)
    yield services
    await services.stop()


async def runs(session: toolmesh.Session, label: str) -> int:
    """Runs of ``counter`` so far (it counts in its executor), by a call that needs no
    approval."""
    message = await session.call("counter", {"label": label}, call_id=label)
    return int(json.loads(message["content"])["runs"])


async def approval_of(session: toolmesh.Session, call_id: str) -> Mapping[str, Any]:
    """The ``approval`` event of ``call_id``."""
    async for event in session.events():
        if event.type == "approval" and event.body.get("tool_call_id") == call_id:
            return event.body
    raise AssertionError("the session closed before the approval event")


async def asked(
    session: toolmesh.Session, label: str
) -> tuple[asyncio.Task[ToolMessage], Mapping[str, Any]]:
    """Calls ``counter`` with ``label`` (a call that waits for its caller); returns the
    awaiting task and the approval event."""
    waiting = asyncio.ensure_future(approval_of(session, label))
    await asyncio.sleep(0)  # the listener is subscribed before the call goes out
    call = asyncio.create_task(session.call("counter", {"label": label}, call_id=label))
    event = await asyncio.wait_for(waiting, 30)
    return call, event


async def test_a_confirmed_call_runs_once(
    nats_server: NatsServer, approvals_mesh: MeshServices
) -> None:
    async with (
        await toolmesh.connect(nats_server.url, prefix=PREFIX, default_timeout=30) as mesh,
        mesh.session(sid()) as session,
    ):
        before = await runs(session, "before-yes")
        call, event = await asked(session, "confirm-yes")
        assert event["mode"] == "caller"
        assert event["tool"] == "counter"
        assert event["policies"] == ["operator:counter-confirmed"]
        assert event["expires_at"] > event["requested_at"]
        assert not call.done()  # it waits for the caller
        reply = await session.confirm("confirm-yes", True, reason="looks right")
        assert reply["ok"] is True
        assert reply["decided"]["state"] == "approved"
        message = await asyncio.wait_for(call, 30)
        assert json.loads(message["content"]) == {"label": "confirm-yes", "runs": before + 1}
        # A decision counts once.
        again = await session.confirm("confirm-yes", False)
        assert again["ok"] is False
        assert again["error"]["code"] == "invalid_request"
        # It ran once: the next run of the tool is the one after it.
        assert await runs(session, "after-yes") == before + 2


async def test_a_declined_call_ends_approval_denied_and_never_runs(
    nats_server: NatsServer, approvals_mesh: MeshServices
) -> None:
    async with (
        await toolmesh.connect(nats_server.url, prefix=PREFIX, default_timeout=30) as mesh,
        mesh.session(sid()) as session,
    ):
        before = await runs(session, "before-no")
        call, _ = await asked(session, "confirm-no")
        reply = await session.confirm("confirm-no", False, reason="not now")
        assert reply["ok"] is True
        assert reply["decided"]["state"] == "denied"
        with pytest.raises(ApprovalDeniedError) as refused:
            await asyncio.wait_for(call, 30)
        assert refused.value.details.get("reason") == "not now"
        # The declined call never ran: the next run of the tool follows the one before it.
        assert await runs(session, "after-no") == before + 1


async def test_a_confirm_for_a_call_not_waiting_is_refused(
    nats_server: NatsServer, approvals_mesh: MeshServices
) -> None:
    async with (
        await toolmesh.connect(nats_server.url, prefix=PREFIX, default_timeout=30) as mesh,
        mesh.session(sid()) as session,
    ):
        reply = await session.confirm("never-submitted", True)
        assert reply["ok"] is False
        assert reply["error"]["code"] == "invalid_request"
