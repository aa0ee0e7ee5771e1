"""The error taxonomy a retry loop relies on, and the types a user's script is checked with."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import toolmesh
from toolmesh import (
    DeadlineExceededError,
    ErrorCode,
    OverloadedError,
    PermissionDeniedError,
    ToolmeshError,
    ToolTimeoutError,
    UnauthorizedError,
)

from conftest import start_nats_server


def test_a_code_prints_as_its_wire_code() -> None:
    assert str(ErrorCode.TIMEOUT) == "timeout"
    assert f"{ErrorCode.RATE_LIMITED}" == "rate_limited"
    assert f"{ErrorCode.CANCELLED:>10}" == " cancelled"
    assert ErrorCode.TIMEOUT.value == "timeout"
    error = ToolmeshError.from_wire({"code": "overloaded", "message": "m", "retryable": True})
    assert f"{error.code}" == "overloaded"


def test_timeouts_are_timeout_errors() -> None:
    for cls in (ToolTimeoutError, DeadlineExceededError):
        error = ToolmeshError.from_wire(
            {"code": cls.code.value, "message": "m", "retryable": False}
        )
        assert isinstance(error, cls)
        assert isinstance(error, TimeoutError)
        assert str(error) == "m"
        assert error.message == "m"
        with pytest.raises(TimeoutError):
            raise error


def test_retry_after_is_read_from_the_details() -> None:
    wire = {
        "code": "rate_limited",
        "message": "slow down",
        "retryable": True,
        "details": {"retry_after_ms": 1500},
    }
    assert ToolmeshError.from_wire(wire).retry_after == 1.5  # type: ignore[arg-type]
    assert OverloadedError("full", details={"retry_after_ms": 0}).retry_after == 0
    assert OverloadedError("full").retry_after is None
    assert OverloadedError("full", details={"retry_after_ms": "soon"}).retry_after is None


async def test_refused_credentials_are_not_retryable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "server.conf"
    config.write_text("authorization { user: frontend, password: right }\n")
    server = await start_nats_server(config=str(config))
    try:
        with pytest.raises(UnauthorizedError) as caught:
            await toolmesh.connect(server.url, user="frontend", password="wrong")
        assert isinstance(caught.value, PermissionDeniedError)
        assert caught.value.retryable is False
        assert caught.value.code is ErrorCode.PERMISSION_DENIED
        assert "refused the credentials" in caught.value.message
        with pytest.raises(UnauthorizedError):
            await toolmesh.connect(server.url)  # no credentials at all
        mesh = await toolmesh.connect(server.url, user="frontend", password="right")
        await mesh.close()
        # With no arguments: the URL and the credentials come from the environment.
        monkeypatch.setenv("NATS_URL", server.url)
        monkeypatch.setenv("NATS_USER", "frontend")
        monkeypatch.setenv("NATS_PASSWORD", "wrong")
        with pytest.raises(UnauthorizedError):
            await toolmesh.connect()
        monkeypatch.setenv("NATS_PASSWORD", "right")
        monkeypatch.setenv("TOOLMESH_TENANT", "acme")
        from_env = await toolmesh.connect()
        assert from_env.tenant == "acme"
        assert from_env.nc.connected_url is not None
        assert from_env.nc.connected_url.port == server.port
        await from_env.close()
    finally:
        await server.stop()


def mypy(script: str) -> subprocess.CompletedProcess[str]:
    """Runs ``mypy --strict`` on a user's script that imports the installed package."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "agent.py"
        path.write_text(script)
        return subprocess.run(
            [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(path)],
            capture_output=True,
            text=True,
            cwd=folder,
            check=False,
        )


USER_SCRIPT = """
import toolmesh

async def main(session: toolmesh.Session) -> None:
    handle = await session.submit("echo", {{"text": "hi"}})
    message = await handle
    reveal_type(message)
    await session.call("echo", {{"text": "hi"}}, {option}=5)
"""


def test_mypy_rejects_a_misspelled_option_and_types_await_handle() -> None:
    wrong = mypy(USER_SCRIPT.format(option="timout"))
    assert wrong.returncode == 1, wrong.stdout
    assert 'Unexpected keyword argument "timout"' in wrong.stdout
    right = mypy(USER_SCRIPT.format(option="timeout"))
    assert right.returncode == 0, right.stdout
    assert 'Revealed type is "TypedDict(toolmesh._wire.ToolMessage' in right.stdout
