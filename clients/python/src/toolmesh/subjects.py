"""Subject tokens and the subjects a frontend uses (docs/protocol.md, "Subjects", "Tokens")."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from ._wire import DEFAULT_PREFIX, PROTOCOL_VERSION, SessionEventKind
from .errors import InvalidRequestError

__all__ = ["Subjects", "subject_token"]

_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_MAX_TOKEN = 64
_PREFIX_PART = re.compile(r"[a-z0-9-]+")


def subject_token(name: str) -> str:
    """Maps any non-empty string (tenant, session, tool, call id) to one safe subject token.

    A token never holds ``.``, ``*``, ``>`` or whitespace, and distinct names give distinct
    tokens; the exact rules are in docs/protocol.md ("Tokens").
    """
    if not name:
        raise InvalidRequestError("a name mapped to a subject must not be empty")
    # Pair surrogates up as a JavaScript string would; lone ones stay lone.
    name = name.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    if len(name) <= _MAX_TOKEN and all(ord(c) < 128 and ord(c) in _SAFE for c in name):
        return name
    try:
        data = name.encode("utf-8")
        out = "".join(chr(b) if b in _SAFE else f"={b:02x}" for b in data)
    except UnicodeEncodeError:  # a lone surrogate: escape UTF-16 code units instead
        data = name.encode("utf-16-le", "surrogatepass")
        units = [int.from_bytes(data[i : i + 2], "little") for i in range(0, len(data), 2)]
        out = "".join(chr(u) if u in _SAFE else f"=u{u:04x}" for u in units)
    if len(out) <= _MAX_TOKEN:
        return out
    return out[:38] + "==" + hashlib.sha256(data).hexdigest()[:24]


@dataclass(frozen=True)
class Subjects:
    """Every subject and stream name one frontend of one tenant uses under a prefix."""

    prefix: str
    tenant: str

    def __post_init__(self) -> None:
        parts = self.prefix.split(".")
        if not all(_PREFIX_PART.fullmatch(p) for p in parts):
            raise InvalidRequestError(
                f"invalid prefix {self.prefix!r}: dot-separated parts of [a-z0-9-]+ "
                f"(for example {DEFAULT_PREFIX!r} or 'acme.prod')"
            )

    @property
    def base(self) -> str:
        return f"{self.prefix}.{PROTOCOL_VERSION}"

    @property
    def tenant_token(self) -> str:
        return subject_token(self.tenant)

    @property
    def sessions_stream(self) -> str:
        """The stream that stores results, schema events and rejections."""
        return self.prefix.replace(".", "_").upper() + "_SESSIONS"

    @property
    def inbox_prefix(self) -> str:
        """The frontend's inbox prefix, ``_INBOX.{p}.frontend.{t}`` (docs/security.md)."""
        return f"_INBOX.{self.prefix}.frontend.{self.tenant_token}"

    def calls(self, session_id: str) -> str:
        return f"{self.base}.calls.{self.tenant_token}.{subject_token(session_id)}"

    def cancel(self, session_id: str) -> str:
        return f"{self.base}.cancel.{self.tenant_token}.{subject_token(session_id)}"

    def confirm(self, session_id: str) -> str:
        """Where the caller confirms or declines its session's waiting calls."""
        return f"{self.base}.confirm.{self.tenant_token}.{subject_token(session_id)}"

    def session_events(self, session_id: str) -> str:
        """The one subscription that carries everything for a session."""
        return f"{self._session(session_id)}.>"

    def result(self, session_id: str, call_id: str) -> str:
        return f"{self._session(session_id)}.result.{subject_token(call_id)}"

    def rejected(self, session_id: str, seq: int) -> str:
        return f"{self._session(session_id)}.rejected.{seq}"

    def schema(self, session_id: str, tool: str) -> str:
        return f"{self._session(session_id)}.schema.{subject_token(tool)}"

    def rpc(self, kind: str) -> str:
        """``resolve``, ``catalog``, ``describe``, ``expand`` or ``groups``."""
        return f"{self.base}.rpc.{self.tenant_token}.{kind}"

    def direct_get(self, subject: str) -> str:
        """The direct get of the last message on a stored session subject."""
        return f"$JS.API.DIRECT.GET.{self.sessions_stream}.{subject}"

    @staticmethod
    def event_kind(subject: str) -> SessionEventKind | None:
        """The kind of a session event subject (its second-to-last token), if known."""
        parts = subject.rsplit(".", 2)
        if len(parts) < 3:
            return None
        kind = parts[1]
        if kind in ("result", "progress", "schema", "rejected", "approval"):
            return kind  # type: ignore[return-value]
        return None

    def _session(self, session_id: str) -> str:
        return f"{self.base}.sessions.{self.tenant_token}.{subject_token(session_id)}"
