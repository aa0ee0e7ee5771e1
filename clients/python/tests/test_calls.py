"""Calls through the real mesh: results, defaults, typed errors, idempotency, cancel, progress."""

from __future__ import annotations

import asyncio
import gc
import json
import tracemalloc
import uuid
from typing import Any

import pytest

import toolmesh
from toolmesh import (
    CallCancelledError,
    IdempotencyConflictError,
    InvalidParametersError,
    MissingArgumentsError,
    ToolDisabledError,
    ToolError,
    UnknownToolError,
)

from conftest import NatsServer


def sid() -> str:
    return f"py-{uuid.uuid4().hex[:12]}"


def content(message: toolmesh.ToolMessage) -> Any:
    return json.loads(message["content"])


async def test_a_call_returns_its_result_with_defaults_filled(mesh: toolmesh.Mesh) -> None:
    async with mesh.session(sid()) as session:
        message = await session.call(
            "inspect", {"query": "cu bulk", "options": {}}, context={"user": "ada"}
        )
    assert message["role"] == "tool"
    assert message["name"] == "inspect"
    body = content(message)
    assert body["args"] == {"query": "cu bulk", "limit": 10, "options": {"lang": "en"}}
    assert body["context"]["user"] == "ada"
    assert body["idempotencyKey"].endswith(f"/{message['tool_call_id']}")


async def test_an_openai_tool_call_with_json_text_arguments(mesh: toolmesh.Mesh) -> None:
    async with mesh.session(sid()) as session:
        tool_call = {
            "id": "call_py_openai",
            "type": "function",
            "function": {"name": "inspect", "arguments": '{"query":"x","limit":3}'},
        }
        message = await session.call(tool_call)
    assert message["tool_call_id"] == "call_py_openai"
    assert content(message)["args"]["limit"] == 3


async def test_missing_arguments_raise_with_the_missing_list(mesh: toolmesh.Mesh) -> None:
    async with mesh.session(sid()) as session:
        with pytest.raises(MissingArgumentsError) as caught:
            await session.call("inspect", {"limit": 5})
    error = caught.value
    assert error.code == toolmesh.ErrorCode.MISSING_ARGUMENTS
    assert error.retryable is False
    assert error.details["missing_required"] == ["query"]


async def test_typed_errors_per_code(mesh: toolmesh.Mesh) -> None:
    async with mesh.session(sid()) as session:
        with pytest.raises(UnknownToolError) as unknown:
            await session.call("inspekt", {"query": "x"})
        assert "inspect" in unknown.value.details["close_matches"]
        with pytest.raises(InvalidParametersError) as invalid:
            await session.call("inspect", {"query": "x", "limit": 500})
        assert invalid.value.details["errors"][0]["path"] == "/limit"
        with pytest.raises(ToolError) as failed:
            await session.call("fail", {})
        assert failed.value.retryable is False
        assert "failed on purpose" in failed.value.message
        # The failed call's tool message is there for the model, error included.
        handle = await session.submit("fail", {"why": "again"})
        message = await handle.message()
        assert message["content"].startswith("Error: ")
        assert message.get("error", {}).get("code") == "tool_error"


async def test_a_call_id_submitted_again_runs_once(mesh: toolmesh.Mesh) -> None:
    async with mesh.session(sid()) as session:
        first = await session.call("counter", {"label": "once"}, call_id="c-once")
        again = await session.call("counter", {"label": "once"}, call_id="c-once")
        other = await session.call("counter", {"label": "once"}, call_id="c-twice")
    assert content(again)["runs"] == content(first)["runs"]
    assert content(other)["runs"] > content(first)["runs"]


async def test_a_reused_key_with_other_arguments_is_rejected_on_its_own_subject(
    mesh: toolmesh.Mesh,
) -> None:
    async with mesh.session(sid()) as session:
        events: list[toolmesh.SessionEvent] = []

        async def listen() -> None:
            async for event in session.events():
                events.append(event)

        listener = asyncio.create_task(listen())
        await asyncio.sleep(0)
        owner = await session.call("counter", {"label": "a"}, call_id="k1", idempotency_key="k")
        with pytest.raises(IdempotencyConflictError) as caught:
            await session.call("counter", {"label": "b"}, call_id="k2", idempotency_key="k")
        assert caught.value.details["call_id"] == "k1"
        # The owner's stored answer is untouched: the same submission gets it again.
        again = await session.call("counter", {"label": "a"}, call_id="k1", idempotency_key="k")
        assert content(again) == content(owner)
        listener.cancel()
    rejected = [e for e in events if e.type == "rejected"]
    assert len(rejected) == 1
    assert rejected[0].body["tool_call_id"] == "k2"
    assert isinstance(rejected[0].body["seq"], int)
    assert not [e for e in events if e.type == "result" and e.body["tool_call_id"] == "k2"]


async def test_progress_streams_before_the_result(mesh: toolmesh.Mesh) -> None:
    async with mesh.session(sid()) as session:
        handle = await session.submit("slow", {"ms": 50, "steps": 3})
        steps = [event["data"]["step"] async for event in handle.progress()]
        message = await handle.result()
    assert steps == [0, 1, 2]
    assert content(message) == {"slept": 50}


async def test_cancel_states(mesh: toolmesh.Mesh) -> None:
    async with mesh.session(sid()) as session:
        handle = await session.submit("slow", {"ms": 20_000, "steps": 1})
        async for _ in handle.progress():
            break  # running now
        reply = await handle.cancel()
        assert reply["state"] == "cancelled"
        assert reply["cancelled"] is True
        with pytest.raises(CallCancelledError):
            await handle.result()
        again = await handle.cancel()
        assert again == {**again, "state": "done", "cancelled": False}
        early = await session.cancel("not-submitted-yet")
        assert early["state"] == "pending"
        # The kept cancellation answers the call when it comes.
        with pytest.raises(CallCancelledError):
            await session.call("slow", {"ms": 1}, call_id="not-submitted-yet")


async def test_a_local_problem_settles_without_the_mesh(mesh: toolmesh.Mesh) -> None:
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(200):
        node["x"] = {}
        node = node["x"]
    async with mesh.session(sid()) as session:
        with pytest.raises(toolmesh.InvalidArgumentsError):
            await session.call("inspect", {"query": "x", "deep": deep})


async def test_several_listeners_each_get_every_event(mesh: toolmesh.Mesh) -> None:
    async with mesh.session(sid()) as session:

        async def first_result() -> str:
            async for event in session.events():
                if event.type == "result":
                    return str(event.body["tool_call_id"])
            return ""

        a = asyncio.create_task(first_result())
        b = asyncio.create_task(first_result())
        await asyncio.sleep(0.05)
        await session.call("inspect", {"query": "x"}, call_id="both")
        assert list(await asyncio.wait_for(asyncio.gather(a, b), 5)) == ["both", "both"]


async def test_openai_messages_in_tool_messages_out(mesh: toolmesh.Mesh) -> None:
    assistant = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "inspect", "arguments": "{}"}},
            {
                "id": "t2",
                "type": "function",
                "function": {"name": "inspect", "arguments": '{"query":"q"}'},
            },
        ],
    }
    async with mesh.session(sid()) as session:
        messages = await session.run_tool_calls(assistant)
    assert [m["tool_call_id"] for m in messages] == ["t1", "t2"]
    assert messages[0].get("error", {}).get("code") == "missing_arguments"
    assert "error" not in messages[1]


async def test_dry_run_catalog_and_groups(mesh: toolmesh.Mesh) -> None:
    session_id = sid()
    resolved = await mesh.resolve(session_id, "inspect", {"query": "q"})
    call = resolved["resolved"]
    assert call["arguments"]["limit"] == 10
    sources = {p["name"]: p["source"] for p in call["input_parameters"]}
    assert sources == {"query": "tool_args", "limit": "default", "options": "default"}
    with pytest.raises(UnknownToolError):
        await mesh.resolve(session_id, "nope", {})

    catalog = await mesh.catalog()
    names = {entry["name"] for entry in catalog["tools"]}
    assert {"inspect", "slow", "fail", "counter"} <= names

    async with mesh.session(session_id) as session:
        groups = await session.set_groups(disable=["risky"])
        risky = next(g for g in groups if g["name"] == "risky")
        assert risky == {"name": "risky", "active": False, "source": "session", "tools": ["fail"]}
        # A switch applies once the resolver's watch has it: wait for the dry run to say so.
        for _ in range(100):
            try:
                await mesh.resolve(session_id, "fail", {})
            except ToolDisabledError:
                break
            await asyncio.sleep(0.05)
        with pytest.raises(ToolDisabledError):
            await session.call("fail", {})
        session_catalog = await session.catalog()
        assert "fail" not in {entry["name"] for entry in session_catalog["tools"]}
        await session.set_groups(reset=["risky"])


async def test_no_server_is_a_one_line_unavailable_error() -> None:
    with pytest.raises(toolmesh.UnavailableError) as caught:
        await toolmesh.connect("nats://127.0.0.1:1")
    assert "cannot connect to NATS at nats://127.0.0.1:1" in caught.value.message
    assert "\n" not in caught.value.message


async def test_without_a_mesh_calls_and_cancels_fail_typed(nats_server: NatsServer) -> None:
    # Another prefix on the same server: no stream takes its calls, no resolver answers.
    alone = await toolmesh.connect(nats_server.url, prefix="nomesh")
    async with alone, alone.session(sid()) as session:
        with pytest.raises(toolmesh.UnavailableError, match="no stream took the message on nomesh"):
            await session.call("inspect", {"query": "x"}, timeout=0.6)
        reply = await session.cancel("c1")
        assert reply["state"] == "unknown"
        assert reply.get("error", {}).get("code") == "unavailable"
        with pytest.raises(toolmesh.UnavailableError, match="no schema expander"):
            await session.catalog()


async def test_a_call_over_the_servers_max_payload_settles_on_its_own_id(
    mesh: toolmesh.Mesh,
) -> None:
    async with mesh.session(sid()) as session:
        handle = await session.submit("echo", {"text": "x" * 1_100_000}, call_id="too-large")
        message = await handle.message()
        assert message["tool_call_id"] == "too-large"
        with pytest.raises(toolmesh.PayloadTooLargeError) as caught:
            await handle
        assert caught.value.retryable is False
        assert "max_payload" in caught.value.message


async def test_arguments_json_cannot_hold_settle_locally(mesh: toolmesh.Mesh) -> None:
    async with mesh.session(sid()) as session:
        with pytest.raises(toolmesh.InvalidArgumentsError):
            await session.call("inspect", {"query": float("nan")})


def test_a_final_message_for_other_arguments_does_not_answer_a_submission() -> None:
    from toolmesh.client import _answers, _arguments_hash, _Pending

    loop = asyncio.new_event_loop()
    try:
        text = '{"query":"x"}'
        pending = _Pending("c1", "inspect", _arguments_hash(text), loop.create_future())
        base: toolmesh.ToolMessage = {
            "role": "tool",
            "tool_call_id": "c1",
            "name": "inspect",
            "content": "{}",
            "session_id": "s",
        }
        assert _answers(pending, base)  # no args_hash: an older mesh
        stamped: Any = {**base, "args_hash": _arguments_hash(text)}
        assert _answers(pending, stamped)
        other: Any = {**stamped, "args_hash": _arguments_hash('{"query":"y"}')}
        assert not _answers(pending, other)
        renamed: Any = {**stamped, "name": "other"}
        assert not _answers(pending, renamed)
    finally:
        loop.close()


async def test_a_new_call_id_under_a_key_in_flight_is_refused_retryably(
    mesh: toolmesh.Mesh,
) -> None:
    async with mesh.session(sid()) as session:
        owner = await session.submit(
            "slow", {"ms": 1500, "steps": 1}, call_id="f1", idempotency_key="fk"
        )
        async for _ in owner.progress():
            break  # running
        with pytest.raises(toolmesh.IdempotencyInFlightError) as caught:
            await session.call("slow", {"ms": 1500, "steps": 1}, call_id="f2", idempotency_key="fk")
        assert caught.value.retryable is True
        assert caught.value.details["call_id"] == "f1"
        first = await owner.result()
        # Once the owner ended, the same key under the new id is answered from the store.
        again = await session.call(
            "slow", {"ms": 1500, "steps": 1}, call_id="f2", idempotency_key="fk"
        )
        assert again["content"] == first["content"]
        assert again["tool_call_id"] == "f2"


async def test_a_reused_call_id_is_not_settled_by_the_owners_stored_result(
    mesh: toolmesh.Mesh,
) -> None:
    async with mesh.session(sid()) as session:
        await session.call("counter", {"label": "a"}, call_id="r1")
        handle = await session.submit("counter", {"label": "b"}, call_id="r1")
        # Catch-up reads the result subject, which holds the owner's result (other arguments).
        session.catch_up()
        with pytest.raises(IdempotencyConflictError):
            await handle.result()


async def test_a_session_remembers_digests_of_final_messages_not_their_text(
    mesh: toolmesh.Mesh,
) -> None:
    """Repeated final messages are dropped by a digest of each: large results leave the
    session's memory about as it was."""
    text = "x" * (256 * 1024)
    async with mesh.session(sid()) as session:
        await session.call("echo", {"text": "warm"})
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for i in range(24):
                message = await session.call("echo", {"text": f"{text}{i}"})
                assert len(message["content"]) == len(text) + len(str(i))
                del message
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
    # Keeping each result's text would hold 6 MB.
    assert grown < 2 * 1024 * 1024
