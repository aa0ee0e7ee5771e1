"""The package's wire constants and shapes against the repository's schemas/ (fails on drift)."""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any

import pytest

from toolmesh import _wire, errors

SCHEMAS = Path(__file__).resolve().parents[3] / "schemas"


def definition(file: str, name: str | None = None, ok: bool | None = None) -> dict[str, Any]:
    """A definition of a schema file; for a reply, its ``ok: true`` or ``ok: false`` branch."""
    document = json.loads((SCHEMAS / file).read_text())
    defs: dict[str, Any] = document["$defs"]
    found: dict[str, Any] = defs[name or document["$ref"].rsplit("/", 1)[1]]
    if ok is not None:
        found = next(b for b in found["anyOf"] if b["properties"]["ok"].get("const") is ok)
    return found


SHAPES: list[tuple[type, str, str | None, bool | None]] = [
    (_wire.WireError, "wire-error.json", None, None),
    (_wire.ToolCall, "tool-call.json", None, None),
    (_wire.CallRequest, "call-request.json", None, None),
    (_wire.ToolMessage, "tool-message.json", None, None),
    (_wire.Rejection, "rejection.json", None, None),
    (_wire.ProgressEvent, "progress-event.json", None, None),
    (_wire.SchemaEvent, "schema-event.json", None, None),
    (_wire.ToolSchema, "describe-reply.json", "ToolSchema", None),
    (_wire.CancelRequest, "cancel-request.json", None, None),
    (_wire.CancelReply, "cancel-reply.json", None, None),
    (_wire.CatalogRequest, "catalog-request.json", None, None),
    (_wire.CatalogEntry, "catalog-reply.json", "CatalogEntry", None),
    (_wire.Catalog, "catalog-reply.json", None, True),
    (_wire.DescribeRequest, "describe-request.json", None, None),
    (_wire.Described, "describe-reply.json", None, True),
    (_wire.ExpandRequest, "expand-request.json", None, None),
    (_wire.Expanded, "expand-reply.json", None, True),
    (_wire.GroupsRequest, "groups-request.json", None, None),
    (_wire.Groups, "groups-reply.json", None, True),
    (_wire.Failed, "groups-reply.json", None, False),
    (_wire.Resolved, "resolve-reply.json", None, True),
    (_wire.ResolvedCall, "resolved-call.json", None, None),
]


@pytest.mark.parametrize(
    ("shape", "file", "name", "ok"), SHAPES, ids=[s[0].__name__ for s in SHAPES]
)
def test_fields_and_required_fields_match_the_schema(
    shape: type, file: str, name: str | None, ok: bool | None
) -> None:
    schema = definition(file, name, ok)
    hints = typing.get_type_hints(shape)
    assert set(hints) == set(schema["properties"]), f"{shape.__name__} fields drifted from {file}"
    required = shape.__required_keys__  # type: ignore[attr-defined]
    assert set(required) == set(schema.get("required", [])), (
        f"{shape.__name__} required fields drifted from {file}"
    )


def test_error_codes_match_the_schema_and_each_has_a_class() -> None:
    codes = definition("wire-error.json")["properties"]["code"]["enum"]
    assert [c.value for c in _wire.ErrorCode] == codes
    for code in codes:
        cls = errors.error_class(code)
        assert cls.code.value == code, f"no error class for {code}"


def test_enumerations_match_the_schema() -> None:
    def enum(file: str, *path: str, name: str | None = None, ok: bool | None = None) -> list[Any]:
        node: Any = definition(file, name, ok)
        for key in path:
            node = node[key]
        return list(node["enum"])

    assert list(_wire.CANCEL_STATES) == enum("cancel-reply.json", "properties", "state")
    assert list(_wire.GROUP_SCOPES) == enum("groups-reply.json", "properties", "scope", ok=True)
    groups = definition("groups-reply.json", ok=True)["properties"]["groups"]["items"]
    assert list(_wire.GROUP_SOURCES) == groups["properties"]["source"]["enum"]
    assert list(_wire.SCHEMA_REASONS) == enum("schema-event.json", "properties", "reason")
    params = definition("resolved-call.json")["properties"]["input_parameters"]["items"]
    assert list(_wire.PARAMETER_SOURCES) == params["properties"]["source"]["enum"]
    assert typing.get_args(_wire.CancelState) == _wire.CANCEL_STATES
    assert list(_wire.CATALOG_NAMES) == enum("catalog-request.json", "properties", "names")
    assert typing.get_args(_wire.CatalogNames) == _wire.CATALOG_NAMES


def test_length_limits_match_the_schema() -> None:
    call = definition("tool-call.json")["properties"]
    assert call["id"]["maxLength"] == _wire.MAX_ID_LENGTH
    resolved = definition("resolved-call.json")["properties"]
    assert resolved["idempotency_key"]["maxLength"] == _wire.MAX_IDEMPOTENCY_KEY_LENGTH
    assert resolved["session_id"]["maxLength"] == _wire.MAX_ID_LENGTH


def test_wire_errors_round_trip_and_a_newer_code_is_kept() -> None:
    wire: _wire.WireError = {
        "code": "unknown_tool",
        "message": "unknown tool",
        "retryable": False,
        "details": {"close_matches": ["echo"]},
    }
    error = errors.ToolmeshError.from_wire(wire)
    assert isinstance(error, errors.UnknownToolError)
    assert error.to_wire() == wire
    newer: _wire.WireError = {"code": "from_the_future", "message": "m", "retryable": True}
    unknown = errors.ToolmeshError.from_wire(newer)
    assert isinstance(unknown, errors.InternalError)
    assert unknown.retryable is True
    assert unknown.to_wire() == newer
