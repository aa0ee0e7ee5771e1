"""Wire constants and message shapes of protocol v1.

Each TypedDict mirrors one definition in the repository's ``schemas/`` (generated from the
protocol's zod definitions); ``tests/test_wire_schemas.py`` fails when a field, a required field
or an enumeration here drifts from those files.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal, TypedDict

PROTOCOL_VERSION = "v1"
DEFAULT_PREFIX = "toolmesh"
DEFAULT_TENANT = "default"
#: Budget of a call that sets none, in seconds (the mesh's default, 60 000 ms).
DEFAULT_CALL_TIMEOUT = 60.0
#: Extra wait past a call's deadline before the client answers it itself, in seconds.
DEFAULT_DEADLINE_GRACE = 2.0
#: How long request-reply exchanges (dry runs, cancels, catalog) wait, in seconds.
DEFAULT_REQUEST_TIMEOUT = 5.0
#: Deepest nesting of arguments and contexts the resolver accepts.
MAX_ARGUMENT_DEPTH = 128
#: Longest call id (``tool_call.id``) and session id, in characters.
MAX_ID_LENGTH = 256
#: Longest idempotency key, in characters.
MAX_IDEMPOTENCY_KEY_LENGTH = 513
#: JetStream API error codes a publish can meet (docs/protocol.md, "Submitting a call").
JS_ERR_MESSAGE_TOO_LARGE = 10054
JS_ERR_STREAM_FULL = 10077


class ErrorCode(StrEnum):
    """Every error code that can cross the wire (docs/errors.md). A ``StrEnum``: ``str(code)``
    and ``f"{code}"`` are the wire code (``"timeout"``)."""

    INVALID_ARGUMENTS = "invalid_arguments"
    INVALID_REQUEST = "invalid_request"
    UNKNOWN_TOOL = "unknown_tool"
    INVALID_PARAMETERS = "invalid_parameters"
    MISSING_ARGUMENTS = "missing_arguments"
    TOOL_DISABLED = "tool_disabled"
    TIMEOUT = "timeout"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    TOOL_ERROR = "tool_error"
    UNAVAILABLE = "unavailable"
    PERMISSION_DENIED = "permission_denied"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    CANCELLED = "cancelled"
    OVERLOADED = "overloaded"
    RATE_LIMITED = "rate_limited"
    QUOTA_EXCEEDED = "quota_exceeded"
    IDEMPOTENCY_CONFLICT = "idempotency_conflict"
    IDEMPOTENCY_IN_FLIGHT = "idempotency_in_flight"
    CREDENTIAL_REQUIRED = "credential_required"
    APPROVAL_DENIED = "approval_denied"
    APPROVAL_EXPIRED = "approval_expired"
    INTERNAL = "internal"


_RETRYABLE_BY_DEFAULT = frozenset(
    {
        ErrorCode.TIMEOUT,
        ErrorCode.UNAVAILABLE,
        ErrorCode.OVERLOADED,
        ErrorCode.RATE_LIMITED,
        ErrorCode.IDEMPOTENCY_IN_FLIGHT,
        ErrorCode.INTERNAL,
    }
)


def is_retryable_by_default(code: ErrorCode) -> bool:
    """Whether errors with this code are retryable when nobody said otherwise."""
    return code in _RETRYABLE_BY_DEFAULT


CatalogNames = Literal["mesh", "provider_safe"]
CATALOG_NAMES: tuple[CatalogNames, ...] = ("mesh", "provider_safe")
CancelState = Literal["cancelled", "done", "pending", "unknown"]
CANCEL_STATES: tuple[CancelState, ...] = ("cancelled", "done", "pending", "unknown")
GroupScope = Literal["tenant", "session"]
GROUP_SCOPES: tuple[GroupScope, ...] = ("tenant", "session")
GroupSource = Literal["default", "tenant", "session"]
GROUP_SOURCES: tuple[GroupSource, ...] = ("default", "tenant", "session")
SchemaReason = Literal["missing_arguments", "expand"]
SCHEMA_REASONS: tuple[SchemaReason, ...] = ("missing_arguments", "expand")
ParameterSource = Literal["edge", "tool_args", "default", "zero_value"]
PARAMETER_SOURCES: tuple[ParameterSource, ...] = ("edge", "tool_args", "default", "zero_value")
#: The session event kinds (second-to-last subject token).
SessionEventKind = Literal["result", "progress", "schema", "rejected", "approval"]
SESSION_EVENT_KINDS: tuple[SessionEventKind, ...] = (
    "result",
    "progress",
    "schema",
    "rejected",
    "approval",
)


class _WireErrorRequired(TypedDict):
    code: str
    message: str
    retryable: bool


class WireError(_WireErrorRequired, total=False):
    """The error envelope (schemas/wire-error.json)."""

    details: dict[str, Any]


class FunctionCall(TypedDict):
    """``tool_call.function``: arguments as JSON text (OpenAI) or an object."""

    name: str
    arguments: str | dict[str, Any]


class _ToolCallRequired(TypedDict):
    id: str
    function: FunctionCall


class ToolCall(_ToolCallRequired, total=False):
    """One entry of an OpenAI ``tool_calls`` array (schemas/tool-call.json)."""

    type: Literal["function"]


class _ActorRequired(TypedDict):
    subject: str


class Actor(_ActorRequired, total=False):
    """A service acting for the caller (the JWT's nested ``act``)."""

    issuer: str


class _CallerIdentityRequired(TypedDict):
    issuer: str
    subject: str
    tenant: str


class CallerIdentity(_CallerIdentityRequired, total=False):
    """Who a call acts for, as verified by the frontend (schemas/caller-identity.json)."""

    actor: list[Actor]


class _CallRequestRequired(TypedDict):
    tool_call: ToolCall
    session_id: str


class CallRequest(_CallRequestRequired, total=False):
    """What a frontend publishes on ``{p}.v1.calls.{t}.{s}`` (schemas/call-request.json)."""

    idempotency_key: str
    context: dict[str, Any]
    agent_context: dict[str, Any]
    agent: str
    timeout_ms: int
    attempt_timeout_ms: int
    edge_params: list[str]
    identity: CallerIdentity


class _ToolMessageRequired(TypedDict):
    role: Literal["tool"]
    tool_call_id: str
    name: str
    content: str
    session_id: str


class ToolMessage(_ToolMessageRequired, total=False):
    """The one final message of a call (schemas/tool-message.json); ``error`` when it failed.
    ``args_hash`` names the arguments of the call it ends (SHA-256 of them as submitted)."""

    error: WireError
    attempts: int
    duration_ms: float
    args_hash: str


class _RejectionRequired(TypedDict):
    role: Literal["tool"]
    tool_call_id: str
    name: str
    content: str
    error: WireError
    session_id: str
    seq: int


class Rejection(_RejectionRequired, total=False):
    """A submission refused without touching the call its key names (schemas/rejection.json)."""

    attempts: int
    duration_ms: float
    args_hash: str


class ProgressEvent(TypedDict):
    """A progress update of a running call (schemas/progress-event.json)."""

    tool_call_id: str
    name: str
    session_id: str
    seq: int
    attempt: int
    data: Any
    at: float


class _ToolSchemaRequired(TypedDict):
    tool: str
    revision: int
    summary: str
    description: str
    parameters: dict[str, Any]
    required: list[str]
    groups: list[str]


class ToolSchema(_ToolSchemaRequired, total=False):
    """A tool's full, model-facing parameter schema (``ToolSchema`` in the reply schemas);
    ``progress``: whether the tool emits progress events."""

    progress: bool


class _SchemaEventRequired(_ToolSchemaRequired):
    session_id: str
    reason: SchemaReason
    missing: list[str]
    at: float


class SchemaEvent(_SchemaEventRequired, total=False):
    """A tool's full schema sent to a session (schemas/schema-event.json)."""

    tool_call_id: str
    progress: bool


class _CancelRequestRequired(TypedDict):
    tool_call_id: str
    session_id: str


class CancelRequest(_CancelRequestRequired, total=False):
    """Asks the resolver to cancel a call of the session (schemas/cancel-request.json)."""

    idempotency_key: str


class _CancelReplyRequired(TypedDict):
    cancelled: bool
    state: CancelState


class CancelReply(_CancelReplyRequired, total=False):
    """What became of a cancel request (schemas/cancel-reply.json)."""

    idempotency_key: str
    error: WireError


class _CatalogEntryRequired(TypedDict):
    name: str
    summary: str
    groups: list[str]
    revision: int


class CatalogEntry(_CatalogEntryRequired, total=False):
    """One tool of a catalog, compact or (with ``description`` and ``parameters``) expanded;
    ``progress``: whether the tool emits progress events; ``tool``: in a catalog asked for with
    ``names="provider_safe"``, the mesh name to call (``name`` is then the provider-safe one)."""

    description: str
    parameters: dict[str, Any]
    progress: bool
    tool: str


class OutputStrategy(TypedDict, total=False):
    """How an agent's model gets its tools (``output_strategy`` of a catalog)."""

    function_calling: bool
    fallback_to_structured_output: bool


class CatalogRequest(TypedDict, total=False):
    """Asks for the compact catalog (schemas/catalog-request.json)."""

    session_id: str
    agent: str
    identity: CallerIdentity
    bind_agent: bool
    cursor: str
    names: CatalogNames


class _CatalogRequired(TypedDict):
    ok: Literal[True]
    tools: list[CatalogEntry]
    unavailable: list[str]


class Catalog(_CatalogRequired, total=False):
    """A successful catalog reply (schemas/catalog-reply.json)."""

    agent: str
    output_strategy: OutputStrategy
    next_cursor: str


class _DescribeRequestRequired(TypedDict):
    session_id: str
    tools: list[str]


class DescribeRequest(_DescribeRequestRequired, total=False):
    """Asks for full schemas now (schemas/describe-request.json)."""

    agent: str
    identity: CallerIdentity


class DescribeFailure(TypedDict):
    """A tool ``describe`` could not describe, with the error a call would get."""

    tool: str
    error: WireError


class Described(TypedDict):
    """A successful describe reply (schemas/describe-reply.json)."""

    ok: Literal[True]
    schemas: list[ToolSchema]
    errors: list[DescribeFailure]


class _ExpandRequestRequired(TypedDict):
    session_id: str
    tool: str


class ExpandRequest(_ExpandRequestRequired, total=False):
    """Asks for a tool's schema to be sent again (schemas/expand-request.json)."""

    agent: str


class Expanded(TypedDict):
    """A successful expand reply (schemas/expand-reply.json)."""

    ok: Literal[True]
    schema: ToolSchema


class GroupsRequest(TypedDict, total=False):
    """Lists or switches tool groups (schemas/groups-request.json)."""

    session_id: str
    enable: list[str]
    disable: list[str]
    reset: list[str]


class GroupState(TypedDict):
    """A tool group and whether it is active, and where that comes from."""

    name: str
    active: bool
    source: GroupSource
    tools: list[str]


class Groups(TypedDict):
    """A successful groups reply (schemas/groups-reply.json)."""

    ok: Literal[True]
    scope: GroupScope
    groups: list[GroupState]


class Failed(TypedDict):
    """A failed request-reply answer: ``{"ok": false, "error": …}``."""

    ok: Literal[False]
    error: WireError


class SessionAddress(TypedDict):
    """Tenant and session tokens where a call's answers go."""

    tenant: str
    session: str


class InputParameter(TypedDict):
    """One workflow-node parameter with its value and where the value came from."""

    name: str
    type: Literal["str", "int", "float", "bool", "list", "dict"]
    value: Any
    source: ParameterSource


class _ResolvedCallRequired(TypedDict):
    call_id: str
    tool_call_id: str
    idempotency_key: str
    session_id: str
    address: SessionAddress
    tool: str
    arguments: dict[str, Any]
    missing_required: list[str]
    missing_optional: list[str]
    input_parameters: list[InputParameter]
    context: dict[str, Any]
    agent_context: dict[str, Any]
    timeout_ms: int
    deadline_at: float
    resolved_at: float
    tool_revision: int


class ResolvedCall(_ResolvedCallRequired, total=False):
    """What a dry run shows: the call as it would be routed (schemas/resolved-call.json)."""

    agent: str
    attempt_timeout_ms: int
    identity: CallerIdentity
    decision: dict[str, Any]


class Resolved(TypedDict):
    """A successful dry run (schemas/resolve-reply.json)."""

    ok: Literal[True]
    resolved: ResolvedCall
