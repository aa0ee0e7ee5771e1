"""Typed errors: one class per wire error code (docs/errors.md is the catalogue)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from ._wire import ErrorCode, WireError, is_retryable_by_default

__all__ = [
    "ApprovalDeniedError",
    "ApprovalExpiredError",
    "CallCancelledError",
    "CredentialRequiredError",
    "DeadlineExceededError",
    "IdempotencyConflictError",
    "IdempotencyInFlightError",
    "InternalError",
    "InvalidArgumentsError",
    "InvalidParametersError",
    "InvalidRequestError",
    "MissingArgumentsError",
    "OverloadedError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "QuotaExceededError",
    "RateLimitedError",
    "ToolDisabledError",
    "ToolError",
    "ToolTimeoutError",
    "ToolmeshError",
    "UnauthorizedError",
    "UnavailableError",
    "UnknownToolError",
    "error_class",
]


class ToolmeshError(Exception):
    """An error that crossed the wire, or one the client raises in the same terms.

    ``code`` is one of :class:`ErrorCode`; ``retryable`` says whether the same call may succeed
    if tried again (under a new call id); ``details`` is structured and documented per code.
    """

    code: ClassVar[ErrorCode] = ErrorCode.INTERNAL

    def __init__(
        self,
        message: str,
        *,
        retryable: bool | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = is_retryable_by_default(self.code) if retryable is None else retryable
        self.details: dict[str, Any] = dict(details or {})
        #: The code as the wire carried it: ``code.value``, or a code newer than this client
        #: (raised as :class:`InternalError`), kept so ``to_wire()`` gives it back unchanged.
        self.wire_code: str = self.code.value

    @property
    def retry_after(self) -> float | None:
        """Seconds to wait before trying again, when the error says (``details["retry_after_ms"]``:
        ``overloaded``, ``rate_limited``, a concurrency ``quota_exceeded``); else None."""
        value = self.details.get("retry_after_ms")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            return None
        return value / 1000

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code.value!r}, message={self.message!r})"

    def to_wire(self) -> WireError:
        """The error as the wire carries it."""
        wire: WireError = {
            "code": self.wire_code,
            "message": self.message,
            "retryable": self.retryable,
        }
        if self.details:
            wire["details"] = self.details
        return wire

    @staticmethod
    def from_wire(wire: WireError) -> ToolmeshError:
        """The typed error of a wire error; an unknown code becomes :class:`InternalError`."""
        code = str(wire.get("code", ""))
        details = wire.get("details")
        error = error_class(code)(
            str(wire.get("message", "")),
            retryable=bool(wire.get("retryable", False)),
            details=details if isinstance(details, dict) else None,
        )
        error.wire_code = code or error.code.value
        return error


class InvalidArgumentsError(ToolmeshError):
    """``function.arguments`` is not JSON, or not a JSON object."""

    code = ErrorCode.INVALID_ARGUMENTS


class InvalidRequestError(ToolmeshError):
    """The envelope itself is malformed (missing id, bad session id, wrong types)."""

    code = ErrorCode.INVALID_REQUEST


class UnknownToolError(ToolmeshError):
    """No tool of that name is registered; ``details["close_matches"]`` lists near names."""

    code = ErrorCode.UNKNOWN_TOOL


class InvalidParametersError(ToolmeshError):
    """The arguments fail the tool's JSON Schema; ``details["errors"]`` holds JSON pointers."""

    code = ErrorCode.INVALID_PARAMETERS


class MissingArgumentsError(ToolmeshError):
    """Required arguments are missing; ``details`` has ``missing_required`` and the schema."""

    code = ErrorCode.MISSING_ARGUMENTS


class ToolDisabledError(ToolmeshError):
    """Every group of the tool is switched off for the session."""

    code = ErrorCode.TOOL_DISABLED


class ToolTimeoutError(ToolmeshError, TimeoutError):
    """One attempt ran longer than the tool's per-attempt timeout (``timeout``). A
    ``TimeoutError``, so ``except TimeoutError`` catches it."""

    code = ErrorCode.TIMEOUT


class DeadlineExceededError(ToolmeshError, TimeoutError):
    """The call as a whole ran out of time. A ``TimeoutError``, so ``except TimeoutError``
    catches it."""

    code = ErrorCode.DEADLINE_EXCEEDED


class ToolError(ToolmeshError):
    """The tool itself failed; ``retryable`` says whether trying again may help."""

    code = ErrorCode.TOOL_ERROR


class UnavailableError(ToolmeshError):
    """No worker is available for the tool, no service answers, or the server is unreachable."""

    code = ErrorCode.UNAVAILABLE


class PermissionDeniedError(ToolmeshError):
    """The caller may not do this. Never retryable."""

    code = ErrorCode.PERMISSION_DENIED


class UnauthorizedError(PermissionDeniedError):
    """The NATS server refused the credentials (a wrong password, token, key or ``.creds`` file,
    or one it does not know): raised by :func:`connect`, never retryable. Its wire code is
    ``permission_denied``."""


class PayloadTooLargeError(ToolmeshError):
    """The message is larger than the server or stream accepts."""

    code = ErrorCode.PAYLOAD_TOO_LARGE


class CallCancelledError(ToolmeshError):
    """The call was cancelled (``cancelled``)."""

    code = ErrorCode.CANCELLED


class OverloadedError(ToolmeshError):
    """Too much work in flight for the session; retry after ``details["retry_after_ms"]``."""

    code = ErrorCode.OVERLOADED


class RateLimitedError(ToolmeshError):
    """A rate quota of the tenant, tool or agent refused the call; retry after
    ``details["retry_after_ms"]`` (docs/quotas.md)."""

    code = ErrorCode.RATE_LIMITED


class QuotaExceededError(ToolmeshError):
    """A quota refused the call: ``details["quota"]`` names it and its limit. Retryable for the
    concurrency limits (after ``details["retry_after_ms"]``), not for a daily budget."""

    code = ErrorCode.QUOTA_EXCEEDED


class IdempotencyConflictError(ToolmeshError):
    """The idempotency key names a call with other arguments or another tool."""

    code = ErrorCode.IDEMPOTENCY_CONFLICT


class IdempotencyInFlightError(ToolmeshError):
    """The idempotency key names a call still running under another call id; its final message
    goes to that id (``details["call_id"]``). Retryable: submitted again once that call ended,
    the stored final message answers the new id."""

    code = ErrorCode.IDEMPOTENCY_IN_FLIGHT


class CredentialRequiredError(ToolmeshError):
    """The tool acts as the calling user and has no credential for them (``details["tool"]``,
    ``details["type"]``): the call names no user, or the user registered none for the tool."""

    code = ErrorCode.CREDENTIAL_REQUIRED


class ApprovalDeniedError(ToolmeshError):
    """A person refused a call that waited for approval (``details["decided_by"]``,
    ``details["reason"]``); the tool never ran."""

    code = ErrorCode.APPROVAL_DENIED


class ApprovalExpiredError(ToolmeshError):
    """A call waited for approval past ``details["expires_at"]`` and nobody decided it; the tool
    never ran. Submit it again under a new idempotency key to ask again."""

    code = ErrorCode.APPROVAL_EXPIRED


class InternalError(ToolmeshError):
    """A bug or an unexpected failure inside toolmesh."""

    code = ErrorCode.INTERNAL


_BY_CODE: dict[str, type[ToolmeshError]] = {
    cls.code.value: cls
    for cls in (
        InvalidArgumentsError,
        InvalidRequestError,
        UnknownToolError,
        InvalidParametersError,
        MissingArgumentsError,
        ToolDisabledError,
        ToolTimeoutError,
        DeadlineExceededError,
        ToolError,
        UnavailableError,
        PermissionDeniedError,
        PayloadTooLargeError,
        CallCancelledError,
        OverloadedError,
        RateLimitedError,
        QuotaExceededError,
        IdempotencyConflictError,
        IdempotencyInFlightError,
        CredentialRequiredError,
        ApprovalDeniedError,
        ApprovalExpiredError,
        InternalError,
    )
}


def error_class(code: str) -> type[ToolmeshError]:
    """The error class of a wire code; :class:`InternalError` for a code this client lacks."""
    return _BY_CODE.get(code, InternalError)
