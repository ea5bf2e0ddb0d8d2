"""The hot-path decoder: every rejection reason, their order, and the rows it produces."""

from __future__ import annotations

import dataclasses
import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ackline.schemas import (
    DEFAULT_LIMITS,
    REASONS,
    Envelope,
    Limits,
    Rejection,
    Row,
    SchemaError,
    body_dict,
    canonical_text,
    decode,
    hash_envelope,
    new_envelope,
)
from ackline.schemas.decode import MAX_DETAIL_CHARS

WHEN = datetime(2024, 5, 1, 12, 0, 0, 123_456, tzinfo=UTC)


def envelope(arguments: dict[str, Any] | None = None) -> Envelope:
    return new_envelope(
        "tool.called",
        "txn-1",
        "agent-1",
        "req-1",
        {
            "run_id": "run-1",
            "call_id": "call-1",
            "tool": "web.search",
            "arguments": {"q": "exactly once", "n": 3} if arguments is None else arguments,
        },
        occurred_at=WHEN,
    )


def wire(**changes: Any) -> dict[str, Any]:
    data = envelope().model_dump(mode="json")
    data.update(changes)
    return data


def raw(data: dict[str, Any] | str) -> bytes:
    return (data if isinstance(data, str) else json.dumps(data)).encode("utf-8")


def rejected(value: bytes | None, limits: Limits = DEFAULT_LIMITS) -> Rejection:
    result = decode(value, limits)
    assert isinstance(result, Rejection), result
    assert result.reason in REASONS
    assert len(result.detail) <= MAX_DETAIL_CHARS
    assert "\x00" not in result.detail
    result.detail.encode("utf-8")  # no lone surrogates
    return result


def accepted(value: bytes, limits: Limits = DEFAULT_LIMITS) -> Row:
    result = decode(value, limits)
    assert isinstance(result, Row), result
    return result


# --- a good record ------------------------------------------------------------------------


def test_round_trip_gives_the_producer_hash() -> None:
    env = envelope()
    for value in (
        env.model_dump_json().encode(),
        json.dumps(env.model_dump(mode="json")).encode(),
        json.dumps(env.model_dump(mode="json"), ensure_ascii=False, indent=2).encode(),
    ):
        row = accepted(value)
        assert row.body_hash == hash_envelope(env)
        assert len(row.body_hash) == 32
        assert row.event_id == env.event_id
        assert (row.txn_id, row.type, row.agent_id, row.request_id) == (
            "txn-1",
            "tool.called",
            "agent-1",
            "req-1",
        )
        assert row.occurred_at == WHEN
        assert row.occurred_at.utcoffset() is not None
        assert row.schema_version == 1
        assert row.payload_json == canonical_text(env.payload.model_dump(mode="json"))
        assert json.loads(row.body_json) == body_dict(env)
        assert row.body_json == canonical_text(body_dict(env))


def test_row_and_rejection_are_frozen_slotted_dataclasses() -> None:
    row = accepted(raw(wire()))
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.txn_id = "x"  # type: ignore[misc]
    assert not hasattr(row, "__dict__")
    rejection = rejected(b"")
    with pytest.raises(dataclasses.FrozenInstanceError):
        rejection.reason = "x"  # type: ignore[misc]


def test_non_ascii_text_is_kept_as_is() -> None:
    env = envelope({"q": "café 😀 \u2028", "k\u00e9y": ["ß"]})
    for value in (env.model_dump_json().encode(), json.dumps(env.model_dump(mode="json")).encode()):
        row = accepted(value)
        assert "café 😀 \u2028" in row.payload_json
        assert row.body_hash == hash_envelope(env)


def test_escaped_backslash_u0000_is_text_not_nul() -> None:
    row = accepted(raw(wire(payload={**wire()["payload"], "arguments": {"path": "C:\\u0000"}})))
    assert json.loads(row.payload_json)["arguments"]["path"] == "C:\\u0000"


def test_escaped_surrogate_pair_is_a_valid_character() -> None:
    text = json.dumps(wire()).replace('"exactly once"', '"\\ud83d\\ude00"')
    row = accepted(raw(text))
    assert "😀" in row.payload_json


# --- each reason, with a real example -----------------------------------------------------


def test_empty() -> None:
    assert rejected(None).reason == "empty"
    assert rejected(b"").reason == "empty"


def test_too_large_is_checked_before_parsing() -> None:
    limits = Limits(max_bytes=64)
    assert rejected(b"\xff" * 65, limits).reason == "too_large"
    assert rejected(b"{" * 65, limits).reason == "too_large"
    value = raw(wire())
    accepted(value, Limits(max_bytes=len(value)))
    assert rejected(value, Limits(max_bytes=len(value) - 1)).reason == "too_large"


@pytest.mark.parametrize(
    "value",
    [b"\xff{}", b'{"a": "\xc3"}', b'{"a": "\xed\xa0\x80"}', "{}".encode("utf-16")],
)
def test_not_utf8(value: bytes) -> None:
    assert rejected(value).reason == "not_utf8"


@pytest.mark.parametrize(
    "value",
    [
        b"{",
        b"{'a': 1}",
        b'{"a": 1} {"b": 2}',
        b'{"a": 1,}',
        b'{"a": "x\x00y"}',
        b'{"a": "line\nbreak"}',
        b"\xef\xbb\xbf{}",
        b"   ",
        b'{"n": ' + b"9" * 5000 + b"}",
    ],
)
def test_invalid_json(value: bytes) -> None:
    assert rejected(value).reason == "invalid_json"


@pytest.mark.parametrize("value", [b"[]", b"[1, 2]", b'"text"', b"42", b"null", b"true"])
def test_top_level_must_be_an_object(value: bytes) -> None:
    rejection = rejected(value)
    assert rejection.reason == "invalid_json"
    assert "not a JSON object" in rejection.detail


@pytest.mark.parametrize(
    "value",
    [
        b'{"type": "agent.started", "type": "agent.failed"}',
        b'{"a": {"b": 1, "c": 2, "b": 3}}',
        b'{"a": [{"x": 1}, {"y": 1, "y": 1}]}',
    ],
)
def test_duplicate_key(value: bytes) -> None:
    rejection = rejected(value)
    assert rejection.reason == "duplicate_key"
    assert "repeats the key" in rejection.detail


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_number(literal: str) -> None:
    text = json.dumps(wire()).replace('"n": 3', f'"n": {literal}')
    rejection = rejected(raw(text))
    assert rejection.reason == "non_finite_number"
    assert literal in rejection.detail


def test_too_deep_at_the_limit() -> None:
    def nested(depth: int) -> dict[str, Any]:  # the envelope is depth 1, arguments 3
        value: Any = 1
        for _ in range(depth - 3):
            value = [value]
        return wire(payload={**wire()["payload"], "arguments": {"deep": value}})

    accepted(raw(nested(32)), Limits(max_depth=32))
    assert rejected(raw(nested(33)), Limits(max_depth=32)).reason == "too_deep"
    assert rejected(raw(nested(8)), Limits(max_depth=7)).reason == "too_deep"


@pytest.mark.parametrize("depth", [200_000, 100_000])
def test_very_deep_nesting_is_rejected_without_crashing(depth: int) -> None:
    closed = b'{"a": ' + b"[" * depth + b"]" * depth + b"}"
    assert rejected(closed, Limits(max_bytes=10_000_000)).reason == "too_deep"
    objects = b'{"a":' * depth + b"1" + b"}" * depth
    assert rejected(objects, Limits(max_bytes=10_000_000)).reason == "too_deep"
    unclosed = b"[" * depth
    assert rejected(unclosed, Limits(max_bytes=10_000_000)).reason == "too_deep"


def test_many_shallow_brackets_are_not_too_deep() -> None:
    arguments = {f"k{i}": [[i]] for i in range(200)}
    row = accepted(raw(wire(payload={**wire()["payload"], "arguments": arguments})))
    assert row.body_hash == hash_envelope(envelope(arguments))


@pytest.mark.parametrize("event_type", ["agent.exploded", "", "AGENT.STARTED", "x" * 10_000])
def test_unknown_type(event_type: str) -> None:
    rejection = rejected(raw(wire(type=event_type)))
    assert rejection.reason == "unknown_type"
    assert "unknown event type" in rejection.detail


def test_unknown_type_wins_over_a_broken_envelope() -> None:
    assert rejected(b'{"type": "future.event", "schema_version": 9}').reason == "unknown_type"
    assert rejected(b'{"type": "future.event"}').reason == "unknown_type"


@pytest.mark.parametrize("version", [0, 2, -1, 2**70])
def test_unsupported_version(version: int) -> None:
    rejection = rejected(raw(wire(schema_version=version)))
    assert rejection.reason == "unsupported_version"
    assert "supported: 1" in rejection.detail


@pytest.mark.parametrize(
    ("changes", "where"),
    [
        ({"schema_version": "1"}, "schema_version"),
        ({"schema_version": 1.0}, "schema_version"),
        ({"schema_version": True}, "schema_version"),
        ({"schema_version": None}, "schema_version"),
        ({"type": 7}, "type"),
        ({"type": None}, "type"),
        ({"occurred_at": "2024-05-01T12:00:00"}, "occurred_at"),
        ({"occurred_at": 1714564800}, "occurred_at"),
        ({"event_id": "nope"}, "event_id"),
        ({"txn_id": ""}, "txn_id"),
        ({"kafka_offset": 7}, "kafka_offset"),
        ({"payload": {"run_id": "run-1"}}, "payload.call_id"),
        ({"payload": None}, "payload"),
    ],
)
def test_schema_invalid(changes: dict[str, Any], where: str) -> None:
    rejection = rejected(raw(wire(**changes)))
    assert rejection.reason == "schema_invalid"
    assert f"{where}: " in rejection.detail


@pytest.mark.parametrize("field", ["type", "schema_version", "payload", "event_id"])
def test_missing_field_is_schema_invalid(field: str) -> None:
    data = wire()
    del data[field]
    rejection = rejected(raw(data))
    assert rejection.reason == "schema_invalid"
    assert f"{field}: Field required" in rejection.detail


def test_naive_timestamp_is_schema_invalid() -> None:
    rejection = rejected(raw(wire(occurred_at="2024-05-01T12:00:00.123456")))
    assert rejection.reason == "schema_invalid"
    assert "occurred_at" in rejection.detail
    assert "timezone" in rejection.detail


@pytest.mark.parametrize(
    ("old", "new", "where"),
    [
        ('"txn-1"', '"txn\\u0000"', "txn_id"),
        ('"run-1"', '"run\\ud800"', "payload.run_id"),
        ('"run-1"', '"\\udc00run"', "payload.run_id"),
        ('"exactly once"', '"a\\u0000b"', "payload.arguments"),
        ('"exactly once"', '"\\uD834"', "payload.arguments"),
        ('"q"', '"q\\u0000"', "payload.arguments"),
        ('"q"', '"\\udfff"', "payload.arguments"),
    ],
)
def test_nul_and_lone_surrogate_escapes_are_schema_invalid(old: str, new: str, where: str) -> None:
    text = json.dumps(wire())
    assert old in text
    rejection = rejected(raw(text.replace(old, new, 1)))
    assert rejection.reason == "schema_invalid"
    assert rejection.detail.count(where) >= 1
    assert "NUL" in rejection.detail or "surrogate" in rejection.detail


def test_unknown_type_with_nul_and_surrogate_gives_a_storable_detail() -> None:
    rejection = rejected(raw(json.dumps(wire()).replace('"tool.called"', '"x\\u0000\\ud800"')))
    assert rejection.reason == "unknown_type"


def test_detail_is_capped() -> None:
    payload = {"prompt": "p", "requested_by": "u", "priority": 1, "tools": [""] * 5000}
    data = wire(type="agent.requested", payload=payload)
    rejection = rejected(raw(data))
    assert rejection.reason == "schema_invalid"
    assert len(rejection.detail) == MAX_DETAIL_CHARS
    assert rejection.detail.startswith("5000 validation errors: payload.tools[0]: ")


# --- the order of the checks --------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b'\xff{"a": NaN, "a": 1', "not_utf8"),
        (b'{"a": 1, "a": 2', "invalid_json"),
        (b'[{"a": 1, "a": 2}]', "invalid_json"),
        (b'{"a": NaN, "b": 1,}', "invalid_json"),
        (b'{"a": NaN, "b": {"c": 1, "c": 2}}', "duplicate_key"),
        (b'{"b": {"c": 1, "c": 2}, "a": NaN}', "duplicate_key"),
        (b'{"a": NaN, "type": "nope", "d": [[[[[[[[[[1]]]]]]]]]]}', "non_finite_number"),
        (b'{"type": "nope", "d": [[[[[[[[[[1]]]]]]]]]]}', "too_deep"),
        (b'{"type": "nope", "schema_version": "x"}', "unknown_type"),
    ],
)
def test_reasons_are_checked_in_order(value: bytes, reason: str) -> None:
    assert rejected(value, Limits(max_depth=8)).reason == reason


def test_reasons_list_is_the_documented_order() -> None:
    assert REASONS == (
        "empty",
        "too_large",
        "not_utf8",
        "invalid_json",
        "duplicate_key",
        "non_finite_number",
        "inexact_number",
        "too_deep",
        "unknown_type",
        "unsupported_version",
        "schema_invalid",
    )


def test_limits_must_be_positive() -> None:
    assert Limits() == Limits(max_bytes=1_048_576, max_depth=32)
    with pytest.raises(SchemaError):
        Limits(max_bytes=0)
    with pytest.raises(SchemaError):
        Limits(max_depth=0)


# --- never raises -------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(value=st.binary(max_size=300))
def test_decode_never_raises_on_random_bytes(value: bytes) -> None:
    result = decode(value, Limits(max_bytes=256, max_depth=4))
    assert isinstance(result, Row | Rejection)


_JSONISH = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=6)
    | st.sampled_from(
        ["agent.started", "tool.called", "2024-05-01T12:00:00Z", str(uuid.UUID(int=1))]
    ),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(
    mutation=st.dictionaries(
        st.sampled_from(
            ["type", "schema_version", "occurred_at", "event_id", "txn_id", "payload", "other"]
        ),
        _JSONISH,
        max_size=3,
    ),
    payload_mutation=st.dictionaries(
        st.sampled_from(["run_id", "call_id", "tool", "arguments", "extra"]), _JSONISH, max_size=2
    ),
)
def test_decode_never_raises_on_mangled_envelopes(
    mutation: dict[str, Any], payload_mutation: dict[str, Any]
) -> None:
    data = wire()
    data["payload"] = {**data["payload"], **payload_mutation}
    data.update(mutation)
    try:
        text = json.dumps(data)
    except ValueError:
        return
    result = decode(text.encode("utf-8", "surrogatepass"), Limits(max_depth=64))
    if isinstance(result, Rejection):
        assert result.reason in REASONS
        assert len(result.detail) <= MAX_DETAIL_CHARS
    else:
        assert result.body_hash == hash_envelope(Envelope.model_validate(data))
