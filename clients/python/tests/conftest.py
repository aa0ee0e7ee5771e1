"""A real nats-server and the real mesh services, started once for the whole test run.

nats-server comes from ``TOOLMESH_NATS_SERVER`` or the PATH; the mesh is the repository's
built CLI (``node bin/toolmesh.js serve resolver executor schema-expander``), so run
``npm run build`` at the repository root first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

import toolmesh

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
TOOLS = HERE / "tools"
# Longest log line of the services the tests read.
LOG_LINE_LIMIT = 16 * 1024 * 1024


@dataclass
class NatsServer:
    """A nats-server on random ports with its own store."""

    url: str
    port: int
    process: asyncio.subprocess.Process
    store: str
    args: list[str]

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            await self.process.wait()


async def start_nats_server(
    store: str | None = None, port: int = -1, config: str | None = None
) -> NatsServer:
    """Starts nats-server on a random port and waits for its ports file: with JetStream in a
    temporary store, or as the configuration file ``config`` says."""
    binary = os.environ.get("TOOLMESH_NATS_SERVER") or shutil.which("nats-server")
    if binary is None:
        pytest.fail("nats-server is not on the PATH (or set TOOLMESH_NATS_SERVER)")
    store = store or tempfile.mkdtemp(prefix="toolmesh-py-nats-")
    ports_dir = tempfile.mkdtemp(prefix="toolmesh-py-ports-")
    args = ["-a", "127.0.0.1", "-p", str(port), "--ports_file_dir", ports_dir]
    args += ["-c", config] if config is not None else ["-js", "-sd", store]
    process = await asyncio.create_subprocess_exec(
        binary, *args, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    ports_file = Path(ports_dir) / f"nats-server_{process.pid}.ports"
    for _ in range(200):
        if ports_file.exists() and ports_file.read_text().strip():
            with contextlib.suppress(ValueError):
                url = json.loads(ports_file.read_text())["nats"][0]
                return NatsServer(url, int(url.rsplit(":", 1)[1]), process, store, args)
        if process.returncode is not None:
            err = await process.stderr.read() if process.stderr else b""
            pytest.fail(f"nats-server exited: {err.decode(errors='replace')}")
        await asyncio.sleep(0.05)
    pytest.fail("nats-server did not write its ports file")


@dataclass
class MeshServices:
    """`toolmesh serve` running the resolver, an executor and a schema expander."""

    process: asyncio.subprocess.Process
    reader: asyncio.Task[None] | None = None
    lines: list[dict[str, Any]] = field(default_factory=list)
    _waiters: list[tuple[Callable[[dict[str, Any]], bool], asyncio.Future[None]]] = field(
        default_factory=list
    )

    async def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 120
    ) -> None:
        if any(predicate(line) for line in self.lines):
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((predicate, future))
        await asyncio.wait_for(future, timeout)

    async def read(self) -> None:
        assert self.process.stdout is not None
        async for raw in self.process.stdout:
            try:
                line = json.loads(raw)
            except ValueError:
                line = {"msg": raw.decode(errors="replace")}
            self.lines.append(line)
            for predicate, future in list(self._waiters):
                if not future.done() and predicate(line):
                    future.set_result(None)

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), 15)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


def started(actor: str) -> Callable[[dict[str, Any]], bool]:
    """Matches the log line an actor writes once it has started."""
    return lambda line: line.get("msg") == f"{actor} started"


async def start_mesh(
    env: dict[str, str],
    tools: Path = TOOLS,
    roles: tuple[str, ...] = ("resolver", "executor", "schema-expander"),
) -> MeshServices:
    """Starts the mesh's services (``roles``) in one process and waits until each started."""
    cli = REPO / "bin" / "toolmesh.js"
    process = await asyncio.create_subprocess_exec(
        "node",
        str(cli),
        "serve",
        *roles,
        "--tools-dir",
        str(tools),
        cwd=str(REPO),
        env={"PATH": os.environ.get("PATH", ""), "TOOLMESH_LOG_LEVEL": "info", **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        # Log lines longer than the reader's default 64 KiB would end the reader, and the
        # services would then block writing their log.
        limit=LOG_LINE_LIMIT,
    )
    services = MeshServices(process)
    task = asyncio.get_running_loop().create_task(services.read())
    services.reader = task
    for actor in roles:
        await services.wait_for(started(actor))
    return services


@pytest_asyncio.fixture(scope="session")
async def nats_server() -> AsyncIterator[NatsServer]:
    server = await start_nats_server()
    yield server
    await server.stop()


@pytest_asyncio.fixture(scope="session")
async def mesh_services(nats_server: NatsServer) -> AsyncIterator[MeshServices]:
    services = await start_mesh({"NATS_URL": nats_server.url})
    yield services
    await services.stop()


@pytest_asyncio.fixture(scope="session")
async def mesh(
    nats_server: NatsServer, mesh_services: MeshServices
) -> AsyncIterator[toolmesh.Mesh]:
    async with await toolmesh.connect(nats_server.url, default_timeout=15) as connected:
        yield connected


class TcpProxy:
    """Forwards a local port to the server; ``cut()`` drops every connection and refuses new
    ones until ``restore()``, so a client loses its connection while the server goes on."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._open = True

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    def cut(self) -> None:
        self._open = False
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    def restore(self) -> None:
        self._open = True

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._open:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, ConnectionError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
