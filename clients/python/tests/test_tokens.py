"""Subject tokens: the worked examples of docs/protocol.md ("Tokens"), read from the page."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from toolmesh import InvalidRequestError, Subjects, subject_token

PROTOCOL = Path(__file__).resolve().parents[3] / "docs" / "protocol.md"


def worked_examples() -> list[tuple[str, str]]:
    text = PROTOCOL.read_text()
    section = text.split("Worked examples:", 1)[1].split("So the session id", 1)[0]
    examples: list[tuple[str, str]] = []
    for row in re.findall(r"^\| `([^`]*)`([^|]*)\| `([^`]*)`", section, re.M):
        name, note, token = row
        times = re.search("\u00d7 (\\d+)", note)
        # The table writes names as JSON string escapes (`\ud800`).
        name = json.loads(f'"{name}"')
        examples.append((name * int(times.group(1)) if times else name, token))
    return examples


@pytest.mark.parametrize(("name", "token"), worked_examples())
def test_the_documented_examples(name: str, token: str) -> None:
    assert subject_token(name) == token


def test_the_page_has_its_examples() -> None:
    assert len(worked_examples()) >= 12


def test_an_empty_name_is_refused() -> None:
    with pytest.raises(InvalidRequestError):
        subject_token("")


def test_subjects_of_a_session() -> None:
    subjects = Subjects(prefix="acme.prod", tenant="acme")
    assert subjects.calls("sess 42") == "acme.prod.v1.calls.acme.sess=2042"
    assert subjects.session_events("sess 42") == "acme.prod.v1.sessions.acme.sess=2042.>"
    assert subjects.sessions_stream == "ACME_PROD_SESSIONS"
    assert subjects.inbox_prefix == "_INBOX.acme.prod.frontend.acme"
    assert subjects.direct_get(subjects.result("s", "c.1")) == (
        "$JS.API.DIRECT.GET.ACME_PROD_SESSIONS.acme.prod.v1.sessions.acme.s.result.c=2e1"
    )
    with pytest.raises(InvalidRequestError):
        Subjects(prefix="Acme_prod", tenant="t")
