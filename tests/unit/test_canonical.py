"""The canonical body and its hash: what changes the hash and what does not."""

from __future__ import annotations

import hashlib
import json
import random
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ackline.schemas import (
    Envelope,
    Limits,
    Row,
    SchemaError,
    body_dict,
    body_hash,
    canonical_body,
    canonical_json,
    canonical_text,
    decode,
    hash_envelope,
    new_envelope,
)
from ackline.schemas.canonical import _REFERENCE_ENCODER, _text_with_member, canonical_texts

WHEN = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
ARGUMENTS: dict[str, Any] = {"q": "exactly once", "n": 3, "opts": {"lang": ["en", "fr"]}}


def tool_called(arguments: dict[str, Any] | None = None, **changes: Any) -> Envelope:
    payload = {
        "run_id": "run-1",
        "call_id": "call-1",
        "tool": "web.search",
        "arguments": ARGUMENTS if arguments is None else arguments,
        **changes.pop("payload", {}),
    }
    fields: dict[str, Any] = {
        "txn_id": "txn-1",
        "agent_id": "agent-1",
        "request_id": "req-1",
        "occurred_at": WHEN,
        **changes,
    }
    return new_envelope(
        "tool.called",
        fields.pop("txn_id"),
        fields.pop("agent_id"),
        fields.pop("request_id"),
        payload,
        **fields,
    )


def decoded(data: dict[str, Any] | str | bytes) -> Row:
    if isinstance(data, dict):
        data = json.dumps(data)
    if isinstance(data, str):
        data = data.encode("utf-8")
    row = decode(data, Limits())
    assert isinstance(row, Row), row
    return row


# --- the form itself ----------------------------------------------------------------------


def test_documented_test_vector() -> None:
    """The example in schemas/CANONICAL.md; if this fails, stored hashes would change."""
    env = Envelope.model_validate(
        {
            "event_id": "6a1b3c1e-1f0e-4a8a-9d47-4f3b0f0c7e11",
            "type": "agent.started",
            "txn_id": "req-42",
            "agent_id": "a-7",
            "request_id": "req-42",
            "occurred_at": "2024-05-01T14:00:00+02:00",
            "schema_version": 1,
            "payload": {"run_id": "run-1", "model": "gpt-x"},
        }
    )
    text = (
        '{"agent_id":"a-7","occurred_at":"2024-05-01T12:00:00.000000Z",'
        '"payload":{"model":"gpt-x","run_id":"run-1"},"request_id":"req-42",'
        '"schema_version":1,"txn_id":"req-42","type":"agent.started"}'
    )
    assert canonical_body(env) == text.encode()
    digest = "93e64f4ed6030999a18c5a0ee716d6648bff66ed43607dfe8d78faf99b44b569"
    assert hash_envelope(env).hex() == digest


def test_canonical_json_format() -> None:
    value = {"b": [3, 1.5, True, None], "a": {"z": 'é\n"\\\x01\u2028', "y": 1e300}, "A": -0.0}
    assert canonical_json(value) == (
        '{"A":-0.0,"a":{"y":1e+300,"z":"é\\n\\"\\\\\\u0001\u2028"},"b":[3,1.5,true,null]}'
    ).encode("utf-8")
    assert canonical_text("x") == '"x"'
    assert canonical_text(2**70) == str(2**70)
    assert (
        canonical_json({"é": 1, "e": 2, "z": 3, "😀": 4}) == '{"e":2,"z":3,"é":1,"😀":4}'.encode()
    )


@pytest.mark.parametrize(
    "value",
    [float("nan"), float("inf"), [float("-inf")], {"a": {1, 2}}, {"a": b"x"}, object()],
)
def test_canonical_json_rejects_non_json(value: object) -> None:
    with pytest.raises(SchemaError):
        canonical_json(value)


def test_canonical_json_rejects_lone_surrogates() -> None:
    with pytest.raises(SchemaError):
        canonical_json({"a": "\ud800"})


def test_body_hash_refuses_event_id() -> None:
    env = tool_called()
    with pytest.raises(SchemaError, match="event_id"):
        body_hash(env.model_dump(mode="json"))


def test_all_entry_points_agree() -> None:
    env = tool_called()
    body = body_dict(env)
    assert "event_id" not in body
    digest = hash_envelope(env)
    assert len(digest) == 32
    assert digest == body_hash(body) == hashlib.sha256(canonical_body(env)).digest()
    assert canonical_body(env) == canonical_json(body)
    payload_text, body_text = canonical_texts(env)
    assert body_text == _REFERENCE_ENCODER.encode(body)
    assert payload_text == _REFERENCE_ENCODER.encode(body["payload"])
    row = decoded(env.model_dump(mode="json"))
    assert row.body_hash == digest
    assert row.body_json == body_text
    assert row.payload_json == payload_text


@pytest.mark.parametrize(
    "obj",
    [
        {"payload": {"a": 1}},
        {"a": 1, "payload": [1, 2], "z": "x"},
        {"a": '"payload":0', "payload": {}, "b": {"payload": 0}},
        {"payload": 5, "q": {"payload": 0.5}},
        {'"payload': 0, "payload": "v", "y": [{"payload": 0}]},
    ],
)
def test_splicing_a_member_equals_encoding_the_object(obj: dict[str, Any]) -> None:
    value_text = canonical_text(obj["payload"])
    assert _text_with_member(dict(obj), "payload", value_text) == canonical_text(obj)


# --- what does not change the hash --------------------------------------------------------


def test_event_id_does_not_change_the_hash() -> None:
    one = tool_called(event_id=uuid.uuid4())
    two = tool_called(event_id=uuid.uuid4())
    assert one.event_id != two.event_id
    assert hash_envelope(one) == hash_envelope(two)


def test_key_order_and_whitespace_do_not_change_the_hash() -> None:
    env = tool_called()
    data = env.model_dump(mode="json")
    compact = json.dumps(data, separators=(",", ":"))
    reordered = {key: data[key] for key in reversed(list(data))}
    reordered["payload"] = {key: data["payload"][key] for key in reversed(list(data["payload"]))}
    pretty = json.dumps(reordered, indent=4)
    ascii_only = json.dumps(data, ensure_ascii=True)
    hashes = {decoded(text).body_hash for text in (compact, pretty, ascii_only)}
    assert hashes == {hash_envelope(env)}


@pytest.mark.parametrize(
    "stamp",
    [
        "2024-05-01T12:00:00Z",
        "2024-05-01T12:00:00+00:00",
        "2024-05-01T12:00:00.000000Z",
        "2024-05-01T14:00:00+02:00",
        "2024-05-01T07:30:00-04:30",
        "2024-05-01 12:00:00+00:00",
    ],
)
def test_equivalent_timestamps_hash_the_same(stamp: str) -> None:
    env = tool_called()
    assert decoded(env.model_dump(mode="json") | {"occurred_at": stamp}).body_hash == (
        hash_envelope(env)
    )


def test_equivalent_number_spellings_hash_the_same() -> None:
    base = tool_called().model_dump(mode="json")
    spelled = []
    for number in ("100.0", "1e2", "1.0E2", "1E+2", "100.00"):
        text = json.dumps(base).replace('"n": 3', f'"n": {number}')
        spelled.append(decoded(text).body_hash)
    assert len(set(spelled)) == 1
    as_int = json.dumps(base).replace('"n": 3', '"n": 100')
    assert decoded(as_int).body_hash not in spelled  # int 100 and float 100.0 differ


def test_payload_given_as_model_or_dict_hash_the_same() -> None:
    env = tool_called()
    again = new_envelope("tool.called", "txn-1", "agent-1", "req-1", env.payload, occurred_at=WHEN)
    assert hash_envelope(again) == hash_envelope(env)


# --- what does change it ------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes",
    [
        {"txn_id": "txn-2"},
        {"agent_id": "agent-2"},
        {"request_id": "req-2"},
        {"occurred_at": WHEN + timedelta(microseconds=1)},
        {"payload": {"run_id": "run-2"}},
        {"payload": {"call_id": "call-2"}},
        {"payload": {"tool": "web.fetch"}},
        {"arguments": {**ARGUMENTS, "n": 4}},
        {"arguments": {**ARGUMENTS, "n": 3.0}},
        {"arguments": {**ARGUMENTS, "extra": None}},
        {"arguments": {**ARGUMENTS, "opts": {"lang": ["fr", "en"]}}},
        {"arguments": {**ARGUMENTS, "q": "exactly  once"}},
    ],
)
def test_changing_any_content_field_changes_the_hash(changes: dict[str, Any]) -> None:
    assert hash_envelope(tool_called(**changes)) != hash_envelope(tool_called())


def test_utc_offset_does_not_matter_but_type_does() -> None:
    plus2 = timezone(timedelta(hours=2))
    same = tool_called(occurred_at=datetime(2024, 5, 1, 14, 0, tzinfo=plus2))
    assert hash_envelope(same) == hash_envelope(tool_called())
    other = new_envelope(
        "agent.failed",
        "txn-1",
        "agent-1",
        "req-1",
        {"run_id": "run-1", "error_kind": "x", "error": "y"},
        occurred_at=WHEN,
    )
    assert hash_envelope(other) != hash_envelope(tool_called())


# --- properties ---------------------------------------------------------------------------

_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8)
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _TEXT
)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=20,
)
_ARGUMENTS = st.dictionaries(_TEXT, _JSON, max_size=6)


def _shuffled(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        keys = list(value)
        rng.shuffle(keys)
        return {key: _shuffled(value[key], rng) for key in keys}
    if isinstance(value, list):
        return [_shuffled(item, rng) for item in value]
    return value


_PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_PROPERTY
@given(arguments=_ARGUMENTS, rng=st.randoms(use_true_random=False))
def test_hash_is_invariant_under_key_shuffling(
    arguments: dict[str, Any], rng: random.Random
) -> None:
    env = tool_called(arguments)
    shuffled = tool_called(_shuffled(arguments, rng))
    assert hash_envelope(shuffled) == hash_envelope(env)
    wire = _shuffled(env.model_dump(mode="json"), rng)
    for text in (json.dumps(wire), json.dumps(wire, ensure_ascii=False, indent=1)):
        row = decode(text.encode("utf-8"), Limits(max_depth=512))
        assert isinstance(row, Row), row
        assert row.body_hash == hash_envelope(env)


@_PROPERTY
@given(value=_JSON)
def test_fast_encoder_matches_the_reference_encoder(value: Any) -> None:
    assert canonical_text(value) == json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
