"""The client under the accounts `toolmesh auth config` generates: each tenant's frontend in an
account of its own, reaching the mesh only through the generated imports. It works with its
tenant's credentials and cannot read another tenant's sessions."""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import tempfile
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import nats
import nats.errors
import pytest
import pytest_asyncio
from nats.aio.msg import Msg

import toolmesh

from conftest import REPO, MeshServices, NatsServer, start_mesh, start_nats_server


@dataclass
class AccountsMesh:
    server: NatsServer
    passwords: dict[str, str]
    services: list[MeshServices]


async def toolmesh_cli(*args: str, env: dict[str, str]) -> str:
    process = await asyncio.create_subprocess_exec(
        "node",
        str(REPO / "bin" / "toolmesh.js"),
        *args,
        cwd=str(REPO),
        env={"PATH": os.environ.get("PATH", ""), **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    return out.decode()


def server_config(
    accounts: str, executor_permissions: str, store: str
) -> tuple[str, dict[str, str]]:
    """The generated accounts, plus an executor user in the mesh account (trusted like the
    other services) and every password as a variable of the file."""
    passwords: dict[str, str] = {}
    executor = (
        '      {\n        user: "executor-in-mesh"\n        password: $EXECUTOR_IN_MESH_PASSWORD\n'
        f"        {executor_permissions}\n      }}\n"
    )
    accounts = accounts.replace("  TOOLMESH: {\n    jetstream: enabled\n    users: [\n", "", 1)
    accounts = (
        "accounts {\n  TOOLMESH: {\n    jetstream: enabled\n    users: [\n"
        + executor
        + (accounts.split("accounts {\n", 1)[1])
    )
    variables = []
    for user, variable in re.findall(r'user: "([^"]+)"\n\s+password: \$(\w+)', accounts):
        passwords[user] = secrets.token_hex(12)
        variables.append(f"{variable}: {json.dumps(passwords[user])}")
    jetstream = f"jetstream {{ store_dir: {json.dumps(store)} }}"
    return "\n".join([jetstream, *variables, accounts, ""]), passwords


@pytest_asyncio.fixture(scope="module")
async def accounts_mesh() -> AsyncIterator[AccountsMesh]:
    accounts, permissions = await asyncio.gather(
        toolmesh_cli("auth", "config", "--tenants", "acme,globex", env={}),
        toolmesh_cli("auth", "permissions", "--role", "executor", env={}),
    )
    work = tempfile.mkdtemp(prefix="toolmesh-py-accounts-")
    text, passwords = server_config(accounts, permissions, str(Path(work) / "js"))
    config = Path(work) / "server.conf"
    config.write_text(text)
    server = await start_nats_server(config=str(config))

    def as_user(user: str) -> dict[str, str]:
        return {"NATS_URL": server.url, "NATS_USER": user, "NATS_PASSWORD": passwords[user]}

    await toolmesh_cli("setup", env=as_user("setup"))
    services = list(
        await asyncio.gather(
            start_mesh(as_user("resolver"), roles=("resolver",)),
            start_mesh(as_user("executor-in-mesh"), roles=("executor",)),
            start_mesh(as_user("schema-expander"), roles=("schema-expander",)),
        )
    )
    yield AccountsMesh(server, passwords, services)
    for service in services:
        await service.stop()
    await server.stop()


async def test_a_tenant_frontend_works_with_its_generated_credentials(
    accounts_mesh: AccountsMesh,
) -> None:
    server, passwords = accounts_mesh.server, accounts_mesh.passwords
    with pytest.raises(toolmesh.UnavailableError):
        await toolmesh.connect(server.url, tenant="acme", user="frontend-acme", password="wrong")
    acme = await toolmesh.connect(
        server.url,
        tenant="acme",
        user="frontend-acme",
        password=passwords["frontend-acme"],
        default_timeout=20,
    )
    session_id = f"acme-{uuid.uuid4().hex[:8]}"
    async with acme, acme.session(session_id) as session:
        # The registry watch may need a moment after start-up: retry while the tool is unknown.
        for _ in range(100):
            try:
                message = await session.call("inspect", {"query": "acme"}, call_id=f"u{_}")
                break
            except toolmesh.UnknownToolError:
                await asyncio.sleep(0.1)
        assert json.loads(message["content"])["args"]["limit"] == 10
        with pytest.raises(toolmesh.MissingArgumentsError):
            await session.call("inspect", {})
        assert await session.wait_for_schema("inspect", timeout=10)
        assert "inspect" in {t["name"] for t in (await session.catalog())["tools"]}
        assert (await session.cancel("never-submitted"))["state"] == "pending"
        # A stored answer is read by direct get across the accounts.
        stored = await acme._last_stored(acme.subjects.result(session_id, message["tool_call_id"]))
        assert stored is not None
        assert stored["content"] == message["content"]

        # Another tenant's frontend: its own calls work; acme's session stays out of reach.
        globex = await toolmesh.connect(
            server.url,
            tenant="globex",
            user="frontend-globex",
            password=passwords["frontend-globex"],
            default_timeout=20,
        )
        async with globex, globex.session("g1") as theirs:
            answer = await theirs.call("inspect", {"query": "globex"})
            assert json.loads(answer["content"])["args"]["query"] == "globex"

            seen: list[str] = []
            violations: list[str] = []

            async def on_error(err: Exception) -> None:
                violations.append(str(err))

            spy = await nats.connect(
                server.url,
                user="frontend-globex",
                password=passwords["frontend-globex"],
                inbox_prefix=globex.subjects.inbox_prefix,
                error_cb=on_error,
            )
            try:

                async def record(msg: Msg) -> None:
                    seen.append(msg.subject)

                await spy.subscribe(f"toolmesh.v1.sessions.acme.{session_id}.>", cb=record)
                await spy.subscribe("toolmesh.v1.sessions.acme.>", cb=record)
                await spy.flush()
                # Acme works while globex listens on acme's subjects.
                await session.call("inspect", {"query": "unseen"}, call_id="while-spied")
                with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
                    await spy.request(
                        acme.subjects.direct_get(
                            acme.subjects.result(session_id, message["tool_call_id"])
                        ),
                        b"",
                        timeout=1,
                    )
                # Naming acme as its tenant does not help: nothing to publish on, nothing heard.
                posing = await toolmesh.connect(
                    server.url,
                    tenant="acme",
                    user="frontend-globex",
                    password=passwords["frontend-globex"],
                    inbox_prefix=globex.subjects.inbox_prefix,
                )
                async with posing, posing.session(session_id) as posed:
                    with pytest.raises(toolmesh.ToolmeshError):
                        await posed.call(
                            "inspect", {"query": "x"}, call_id=message["tool_call_id"], timeout=1
                        )
            finally:
                await spy.close()
            assert seen == []
            assert any("permissions violation" in v.lower() for v in violations), violations
