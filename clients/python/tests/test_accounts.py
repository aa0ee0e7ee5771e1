"""The client under the accounts `toolmesh auth config` generates: each tenant's frontend in an
account of its own, reaching the mesh only through the generated imports, on a server that
requires TLS client certificates. It works with its
tenant's credentials and cannot read another tenant's sessions."""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import ssl
import tempfile
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import nats
import nats.errors
import pytest
import pytest_asyncio
from nats.aio.msg import Msg

import toolmesh

from conftest import REPO, MeshServices, NatsServer, start_mesh, start_nats_server


class TlsOptions(TypedDict):
    tls_ca: str
    tls_cert: str
    tls_key: str


@dataclass
class AccountsMesh:
    server: NatsServer
    passwords: dict[str, str]
    services: list[MeshServices]
    pki: Path

    def tls(self) -> TlsOptions:
        """The client's TLS options: the CA and a client certificate it signed."""
        return {
            "tls_ca": str(self.pki / "ca.pem"),
            "tls_cert": str(self.pki / "client.pem"),
            "tls_key": str(self.pki / "client.key"),
        }


async def openssl(cwd: Path, *args: str) -> None:
    process = await asyncio.create_subprocess_exec(
        "openssl",
        *args,
        cwd=str(cwd),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await process.communicate()
    assert process.returncode == 0, err.decode()


async def create_pki(directory: Path) -> None:
    """A throw-away CA, a server certificate for 127.0.0.1 and a client certificate."""
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    await openssl(
        directory,
        "req",
        "-x509",
        *key,
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=ca",
    )
    for name, extensions in (
        ("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ):
        await openssl(
            directory,
            "req",
            *key,
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            f"/CN={name}",
        )
        (directory / f"{name}.ext").write_text(extensions)
        await openssl(
            directory,
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.pem",
            "-days",
            "2",
            "-extfile",
            f"{name}.ext",
        )


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
    accounts: str, executor_permissions: str, store: str, pki: Path
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
    tls = (
        f'tls {{\n  cert_file: "{pki / "server.pem"}"\n  key_file: "{pki / "server.key"}"\n'
        f'  ca_file: "{pki / "ca.pem"}"\n  verify: true\n}}'
    )
    return "\n".join([jetstream, *variables, accounts, tls, ""]), passwords


@pytest_asyncio.fixture(scope="module")
async def accounts_mesh() -> AsyncIterator[AccountsMesh]:
    accounts, permissions = await asyncio.gather(
        toolmesh_cli("auth", "config", "--tenants", "acme,globex", env={}),
        toolmesh_cli("auth", "permissions", "--role", "executor", env={}),
    )
    work = tempfile.mkdtemp(prefix="toolmesh-py-accounts-")
    pki = Path(work) / "pki"
    pki.mkdir()
    await create_pki(pki)
    text, passwords = server_config(accounts, permissions, str(Path(work) / "js"), pki)
    config = Path(work) / "server.conf"
    config.write_text(text)
    server = await start_nats_server(config=str(config))

    def as_user(user: str) -> dict[str, str]:
        return {
            "NATS_URL": server.url,
            "NATS_USER": user,
            "NATS_PASSWORD": passwords[user],
            "NATS_CA": str(pki / "ca.pem"),
            "NATS_CERT": str(pki / "client.pem"),
            "NATS_KEY": str(pki / "client.key"),
        }

    await toolmesh_cli("setup", "--tenants", "acme,globex", env=as_user("setup"))
    services = list(
        await asyncio.gather(
            start_mesh(as_user("resolver"), roles=("resolver",)),
            start_mesh(as_user("executor-in-mesh"), roles=("executor",)),
            start_mesh(as_user("schema-expander"), roles=("schema-expander",)),
        )
    )
    yield AccountsMesh(server, passwords, services, pki)
    for service in services:
        await service.stop()
    await server.stop()


def ssl_context(mesh: AccountsMesh) -> ssl.SSLContext:
    options = mesh.tls()
    context = ssl.create_default_context(cafile=options["tls_ca"])
    context.load_cert_chain(options["tls_cert"], options["tls_key"])
    return context


async def test_a_tenant_frontend_works_with_its_generated_credentials(
    accounts_mesh: AccountsMesh,
) -> None:
    server, passwords = accounts_mesh.server, accounts_mesh.passwords
    with pytest.raises(toolmesh.UnauthorizedError) as refused:
        await toolmesh.connect(
            server.url,
            tenant="acme",
            user="frontend-acme",
            password="wrong",
            **accounts_mesh.tls(),
        )
    assert refused.value.retryable is False
    with pytest.raises(toolmesh.UnavailableError):  # no client certificate
        await toolmesh.connect(
            server.url,
            tenant="acme",
            user="frontend-acme",
            password=passwords["frontend-acme"],
            tls_ca=accounts_mesh.tls()["tls_ca"],
        )
    acme = await toolmesh.connect(
        server.url,
        tenant="acme",
        user="frontend-acme",
        password=passwords["frontend-acme"],
        default_timeout=20,
        **accounts_mesh.tls(),
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
            **accounts_mesh.tls(),
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
                tls=ssl_context(accounts_mesh),
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
                    **accounts_mesh.tls(),
                )
                async with posing, posing.session(session_id) as posed:
                    # Refused at once, not at the call's deadline (which would raise another
                    # error): NATS refuses the session's events to this user.
                    with pytest.raises(
                        toolmesh.PermissionDeniedError, match="check the client's tenant"
                    ):
                        await posed.call(
                            "inspect", {"query": "x"}, call_id=message["tool_call_id"], timeout=30
                        )
            finally:
                await spy.close()
            assert seen == []
            assert any("permissions violation" in v.lower() for v in violations), violations
