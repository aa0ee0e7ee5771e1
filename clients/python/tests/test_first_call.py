"""docs/first-call-python.md, run as written against ``toolmesh dev``; and the Python and
TypeScript lines ``toolmesh dev`` prints, run as printed."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest_asyncio

from conftest import REPO

PAGE = REPO / "docs" / "first-call-python.md"
# The URL the page shows where `toolmesh dev` prints its own.
PAGE_URL = "nats://127.0.0.1:41733"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(), re.S)


@dataclass
class Dev:
    """``toolmesh dev --no-demo`` and what it printed until it was ready."""

    process: asyncio.subprocess.Process
    lines: list[str]
    url: str


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest_asyncio.fixture(scope="module")
async def dev() -> AsyncIterator[Dev]:
    # Nothing listens on the port: `toolmesh dev` starts a nats-server of its own, as it does on
    # a machine without one. The gateway takes any free port.
    process = await asyncio.create_subprocess_exec(
        "node",
        str(REPO / "bin" / "toolmesh.js"),
        "dev",
        "--no-demo",
        cwd=str(REPO),
        env={
            "PATH": os.environ.get("PATH", ""),
            "NATS_URL": f"nats://127.0.0.1:{free_port()}",
            "TOOLMESH_GATEWAY_PORT": "0",
        },
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,
    )
    assert process.stdout is not None
    lines: list[str] = []
    while "Press Ctrl-C to stop." not in lines:
        raw = await asyncio.wait_for(process.stdout.readline(), 120)
        assert raw, f"toolmesh dev ended early: {lines}"
        lines.append(raw.decode().rstrip("\n"))
    match = next(re.match(r"NATS: (\S+) ", line) for line in lines if line.startswith("NATS: "))
    assert match is not None
    yield Dev(process, lines, match.group(1))
    process.send_signal(signal.SIGTERM)
    await asyncio.wait_for(process.wait(), 30)


async def run(*args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    process = await asyncio.create_subprocess_exec(
        *args,
        cwd=str(cwd),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    return out.decode()


async def test_dev_prints_what_the_page_shows(dev: Dev) -> None:
    shown = blocks("text")[0].replace(PAGE_URL, dev.url).splitlines()
    start = dev.lines.index(shown[0])
    assert dev.lines[start : start + 3] == shown[:3]
    assert dev.lines[start + 3].startswith(shown[3].removesuffix(" …"))


async def test_the_page_runs_as_written(dev: Dev, tmp_path: Path) -> None:
    (tmp_path / "first_call.py").write_text(blocks("python")[0])
    command = blocks("sh")[2].strip()
    assert command == f"NATS_URL={PAGE_URL} python first_call.py"
    # The interpreter running the tests is the one the client is installed in.
    command = command.replace(PAGE_URL, dev.url).replace("python ", f"{sys.executable} ", 1)
    out = await run("sh", "-c", command, cwd=tmp_path, env={"PATH": os.environ["PATH"]})
    assert out == blocks("text")[1]


async def test_the_printed_python_line_connects(dev: Dev, tmp_path: Path) -> None:
    at = dev.lines.index("  Python:      import toolmesh")
    connect = dev.lines[at + 1].strip()
    script = tmp_path / "printed.py"
    script.write_text(
        "import asyncio\n\nimport toolmesh\n\n\nasync def main() -> None:\n"
        f"    {connect}\n"
        "    async with mesh, mesh.session('printed-python') as session:\n"
        "        print((await session.call('echo', {'text': 'printed'}))['content'])\n\n\n"
        "asyncio.run(main())\n"
    )
    out = await run(sys.executable, str(script), cwd=tmp_path, env={"PATH": os.environ["PATH"]})
    assert out == "printed\n"


async def test_the_printed_typescript_lines_connect(dev: Dev) -> None:
    at = next(i for i, line in enumerate(dev.lines) if line.startswith("  TypeScript:  import"))
    imports = dev.lines[at].removeprefix("  TypeScript:  ")
    connect = dev.lines[at + 1].strip()
    program = (
        f"{imports}\n{connect}\n"
        "const session = client.session('printed-ts');\n"
        "const handle = session.submit({ name: 'echo', arguments: { text: 'ts' } });\n"
        "const message = await handle.result;\n"
        "console.log(message.content);\n"
        "process.exit(0);\n"
    )
    out = await run("node", "--input-type=module", "-e", program, cwd=REPO)
    assert out == "ts\n"
