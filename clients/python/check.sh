#!/usr/bin/env bash
# Installs the Python client from the project's own files and runs its gates: ruff (lint and
# format), mypy --strict and pytest against a real nats-server and the mesh's services, in
# clients/python/.venv (the machine's python3, 3.11: the lowest Python the package declares);
# then pytest again on the highest it declares (3.12), in a venv of its own. Python 3.10 is not
# declared: pytest and hatchling need tomli there, which the package mirror does not have. Nor is
# 3.13: the TLS accounts test (tests/test_accounts.py) hangs on it. Run `npm run build` at the
# repository root first; nats-server must be on the PATH (or TOOLMESH_NATS_SERVER set).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

# Where the public index is out of reach and a local mirror serves the packages, a failed index
# look-up is not worth retrying.
export PIP_RETRIES=${PIP_RETRIES:-0}

# Installs the package with its test extra and the langchain extra into the venv $1.
install() {
  "$1/bin/pip" install --quiet -e '.[test]'
  # The langchain extra: langchain-core's own requirement langchain-protocol is not on the
  # package mirror, and the tools need none of it, so langchain-core goes in without its
  # dependencies and the ones it imports are named here.
  "$1/bin/pip" install --quiet httpx jsonpatch 'langsmith<1' packaging 'pydantic>=2.7.4,<3' \
    pyyaml 'tenacity!=8.4.0,<10' typing-extensions 'uuid-utils<1'
  "$1/bin/pip" install --quiet --no-deps 'langchain-core>=0.3'
}

# The interpreter of Python $1: pyenv's (the machines' image has 3.12 there), else
# python$1 on the PATH; one that does not run (a pyenv shim of a version not selected) is none.
interpreter() {
  local candidate
  for candidate in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$1".*/bin/"python$1" \
    "$(command -v "python$1" || true)"; do
    if [[ -n "$candidate" && -x "$candidate" ]] && "$candidate" --version >/dev/null 2>&1; then
      echo "$candidate"
      return
    fi
  done
  echo "check.sh: Python $1 is not installed; the package declares it, so it must be tested" >&2
  exit 1
}

python3 -m venv .venv
install .venv
.venv/bin/python -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version'
.venv/bin/ruff check src tests ../../bench/python
.venv/bin/ruff format --check src tests ../../bench/python
.venv/bin/mypy
.venv/bin/pytest

# Python 3.12: the package and pytest only. mypy and pydantic-core (LangChain) have no 3.12
# wheels on the package mirror, so the check of a user's script with mypy and the LangChain tests
# run on 3.11 alone.
"$(interpreter 3.12)" -m venv .venv-3.12
.venv-3.12/bin/pip install --quiet -e . 'pytest>=8' 'pytest-asyncio>=0.24'
.venv-3.12/bin/python --version
.venv-3.12/bin/pytest --ignore tests/test_langchain.py \
  --deselect tests/test_errors.py::test_mypy_rejects_a_misspelled_option_and_types_await_handle \
  --deselect tests/test_readme.py::test_the_langchain_example_runs
