#!/usr/bin/env bash
# Installs the Python client into clients/python/.venv from the project's own files and runs its
# gates: ruff (lint and format), mypy --strict and pytest against a real nats-server and the
# mesh's services. Run `npm run build` at the repository root first; nats-server must be on the
# PATH (or TOOLMESH_NATS_SERVER set).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

# Where the public index is out of reach and a local mirror serves the packages, a failed index
# look-up is not worth retrying.
export PIP_RETRIES=${PIP_RETRIES:-0}
python3 -m venv .venv
.venv/bin/pip install --quiet -e '.[test]'
# The langchain extra: langchain-core's own requirement langchain-protocol is not on the package
# mirror, and the tools need none of it, so langchain-core goes in without its dependencies and
# the ones it imports are named here.
.venv/bin/pip install --quiet httpx jsonpatch 'langsmith<1' packaging 'pydantic>=2.7.4,<3' \
  pyyaml 'tenacity!=8.4.0,<10' typing-extensions 'uuid-utils<1'
.venv/bin/pip install --quiet --no-deps 'langchain-core>=0.3'

.venv/bin/ruff check src tests ../../bench/python
.venv/bin/ruff format --check src tests ../../bench/python
.venv/bin/mypy
.venv/bin/pytest
