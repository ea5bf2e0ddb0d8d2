"""The decoder's fast path (schemas/decode_fast.py) equals the reference decoder.

``decode`` answers an event itself only when it can prove the reference would accept it
with the same row; these tests pin the edges of that proof (duplicate keys through the
colon count, escapes, numbers, envelope field forms, depth limits, plugin models) and the
encoder facts it rests on. The differential test (test_decode_differential.py) covers
the same ground statistically, over generated and hostile inputs.
"""

from __future__ import annotations

import json
import random
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any

import annotated_types
import msgspec
import pytest
from pydantic import Field, TypeAdapter, create_model

from ackline.core.tuples import builder
from ackline.schemas.decode import (
    DEFAULT_LIMITS,
    MAX_SUPPORTED_DEPTH,
    Limits,
    Rejection,
    Row,
    decode,
    reference_decode,
)
from ackline.schemas.decode_fast import _Body, _EventId, fast_path_models, make_fast_decoder
from ackline.schemas.envelope import ENVELOPES, PAYLOADS, Payload, new_envelope, register_payloads
from ackline.schemas.numbers import exact_float
from ackline.settings import Settings

_slow_calls: list[bytes | None] = []


def _counted(value: bytes | None, limits: Limits = DEFAULT_LIMITS) -> Row | Rejection:
    _slow_calls.append(value)
    return reference_decode(value, limits)


_fast = make_fast_decoder(_counted, builder(Row), exact_float)


def same(value: bytes, limits: Limits = DEFAULT_LIMITS, *, fast_path: bool | None = None) -> Any:
    """Decode with both; assert equal results; optionally assert who answered."""
    _slow_calls.clear()
    got = _fast(value, limits)
    want = reference_decode(value, limits)
    assert got == want
    assert decode(value, limits) == want
    assert type(got) is type(want)
    if isinstance(got, Row):
        assert repr(got.occurred_at) == repr(want.occurred_at)
    if fast_path is not None:
        assert (not _slow_calls) is fast_path, "fast path" if fast_path else "slow path expected"
    return got


def event(arguments_text: str = '{"q":"x","n":3}', **fields: Any) -> bytes:
    env = new_envelope(
        "tool.called",
        "t:1",
        "a",
        "r",
        {"run_id": "r", "call_id": "c", "tool": "t", "arguments": {"x": 0}},
        occurred_at=datetime(2024, 5, 1, 12, tzinfo=UTC),
    )
    data = env.model_dump(mode="json") | fields
    return json.dumps(data, separators=(",", ":")).replace('{"x":0}', arguments_text).encode()


def test_every_registered_model_has_a_fast_path() -> None:
    assert fast_path_models() == dict.fromkeys(ENVELOPES, True)


def test_msgspec_writes_strings_like_the_canonical_encoder_for_every_code_point() -> None:
    encode = msgspec.json.Encoder(order="sorted").encode
    for start in range(0, 0x110000, 0x1000):
        chars = [chr(c) for c in range(start, start + 0x1000) if not 0xD800 <= c <= 0xDFFF]
        text = "".join(chars)
        assert encode(text).decode() == json.dumps(text, ensure_ascii=False)
        for ch in chars[:: 0x40 if start else 1]:
            assert encode({ch: ch}).decode() == json.dumps(
                {ch: ch}, ensure_ascii=False, separators=(",", ":")
            )


def test_msgspec_writes_ints_and_sorts_keys_like_the_canonical_encoder() -> None:
    encode = msgspec.json.Encoder(order="sorted").encode
    rng = random.Random(3)
    ints = [0, -1, 2**63 - 1, -(2**63), 2**63, 2**64 - 1, 2**64, -(2**64), 10**4299]
    ints += [rng.randint(-(2**300), 2**300) for _ in range(2000)]
    for i in ints:
        assert encode(i) == str(i).encode()
    keys = ["b", "a", "", "é", "e", "😀", "\uffff", "Z", "a\x7f", "a\x1f", "\U0010ffff"]
    value = {k: {k2: i for i, k2 in enumerate(reversed(keys))} for k in keys}
    assert encode(value).decode() == json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )


def test_msgspec_hands_every_float_literal_to_the_hook_as_written() -> None:
    seen: list[str] = []

    def hook(literal: str) -> float:
        seen.append(literal)
        return float(literal)

    literals = ["0.1", "1E2", "1e+2", "-0.0", "1.0E-7", "12345678901234567890.5", "0e-400"]
    msgspec.json.Decoder(float_hook=hook).decode(("[" + ",".join(literals) + ",7]").encode())
    assert seen == literals


def test_a_realistic_event_takes_the_fast_path() -> None:
    row = same(event(), fast_path=True)
    assert isinstance(row, Row)


@pytest.mark.parametrize(
    "arguments",
    [
        '{"a":1,"a":1}',
        '{"a":1,"\\u0061":1}',
        '{"k:":1,"k\\u003a":1}',
        '{"x":{"y":[{"z":1,"z":2}]}}',
        '{"s":"a\\":b","s":"c"}',
    ],
)
def test_duplicate_keys_are_never_fast(arguments: str) -> None:
    got = same(event(arguments), fast_path=False)
    assert isinstance(got, Rejection)
    assert got.reason == "duplicate_key"


@pytest.mark.parametrize(
    "arguments",
    [
        '{"k\\u003a":"v:\\u003a","c":"\\\\":1}',  # invalid JSON on purpose: slow path
        '{"k\\u003a":"v:\\u003a"}',  # escaped colons, no duplicate
        '{"t":"\\\\u003a"}',  # the text \\u003a (not a colon): overcounted, slow, accepted
        '{"k":"\\":"}',
    ],
)
def test_colon_counting_edge_cases(arguments: str) -> None:
    same(event(arguments))


@pytest.mark.parametrize(
    "literal",
    [
        "1e400", "-1e400", "1e-400", "-0.0", "0.1", "1E2", "12345678901234567890.5",
        "123456789012345678901234567890", "18446744073709551616", "-9223372036854775809",
        "1e-07", "1e+300", "5e-324", "NaN", "Infinity", "0.10000000000000001", "0e-400",
        "1" + "0" * 4299, "1" + "0" * 4300, "1e-99999999999999999999", "0e-99999999999999999999",
    ],
)  # fmt: skip
def test_numbers_in_free_json_equal_the_reference(literal: str) -> None:
    same(event('{"x":' + literal + ',"y":[' + literal + "]}"))


def test_floats_are_written_by_the_canonical_encoder() -> None:
    row = same(event('{"a":1e-05,"b":1e16,"c":-0.0,"d":1E300}'), fast_path=True)
    assert '"a":1e-05' in row.payload_json
    assert '"b":1e+16' in row.payload_json
    assert '"c":-0.0' in row.payload_json
    assert '"d":1e+300' in row.payload_json


@pytest.mark.parametrize(
    ("literal", "reason"),
    [
        ("0.1", None),
        ("1e-400", "inexact_number"),
        ("12345678901234567890.5", "inexact_number"),
        ("1e400", "non_finite_number"),
        ("0e-400", None),
    ],
)
def test_the_number_rule_holds_on_both_paths(literal: str, reason: str | None) -> None:
    got = same(event('{"x":' + literal + "}"), fast_path=reason is None)
    assert getattr(got, "reason", None) == reason


@pytest.mark.parametrize(
    "changes",
    [
        {"event_id": "6A1B3C1E-1F0E-4A8A-9D47-4F3B0F0C7E11"},
        {"event_id": "6a1b3c1e1f0e4a8a9d474f3b0f0c7e11"},
        {"event_id": "urn:uuid:6a1b3c1e-1f0e-4a8a-9d47-4f3b0f0c7e11"},
        {"event_id": "{6a1b3c1e-1f0e-4a8a-9d47-4f3b0f0c7e11}"},
        {"event_id": "6a1b3c1e-1f0e-4a8a-9d47-4f3b0f0c7e1"},
        {"event_id": 12},
        {"occurred_at": "2024-05-01T14:00:00+02:00"},
        {"occurred_at": "2024-05-01 12:00:00.000000Z"},
        {"occurred_at": "2024-05-01T12:00:00"},
        {"occurred_at": "2024-05-01T12:00:00.123456Z"},
        {"occurred_at": "2024-02-30T00:00:00.000000Z"},
        {"occurred_at": "0001-01-01T00:30:00+01:00"},
        {"txn_id": "x" * 200},
        {"txn_id": "x" * 201},
        {"txn_id": "😀" * 200},
        {"txn_id": "😀" * 201},
        {"txn_id": ""},
        {"txn_id": "a\u0000"},
        {"agent_id": "\ud800"},
        {"schema_version": True},
        {"schema_version": 2},
        {"type": "agent.started"},
        {"type": "agent.paused"},
        {"extra": 1},
    ],
)
def test_envelope_field_variants(changes: dict[str, Any]) -> None:
    same(json.dumps(json.loads(event()) | changes).encode())


@pytest.mark.parametrize("max_depth", [1, 2, 3, 4, 5, 31, 32, 33, 63, 64, 65, 255, 512, 1000])
@pytest.mark.parametrize("nesting", [0, 1, 27, 28, 29, 30, 60, 61, 62, 250, 252, 253, 509, 600])
def test_limits_on_depth(max_depth: int, nesting: int) -> None:
    """arguments is depth 3; ``nesting`` more containers inside it."""
    inner = '{"a":' * nesting + "1" + "}" * nesting
    same(event('{"v":' + inner + "}"), Limits(max_depth=max_depth))
    same(event('{"v":' + "[" * nesting + "]" * nesting + "}"), Limits(max_depth=max_depth))


def test_the_deepest_document_the_settings_allow_decodes() -> None:
    """Before: ACKLINE_MAX_JSON_DEPTH went up to 512, but a document nested 258 deep or more
    was schema_invalid (pydantic-core's serializer limit), not accepted nor too_deep."""
    bound = [m for m in Settings.model_fields["max_json_depth"].metadata if hasattr(m, "le")]
    assert bound and isinstance(bound[0], annotated_types.Le)
    deepest = bound[0].le
    assert isinstance(deepest, int)
    limits = Limits(max_depth=deepest)
    inner = "[" * (deepest - 3) + "]" * (deepest - 3)  # inside arguments, which is depth 3
    got = same(event('{"v":' + inner + "}"), limits)
    assert isinstance(got, Row), got
    deeper = same(event('{"v":[' + inner + "]}"), limits)
    assert isinstance(deeper, Rejection)
    assert deeper.reason == "too_deep"
    assert deepest == MAX_SUPPORTED_DEPTH


def test_a_plugin_model_the_fast_path_does_not_know_goes_slow(registry: None) -> None:
    class StepV7(Payload):
        run_id: str
        note: Annotated[str, Field(default="none")]

    register_payloads({("agent.step", 7): StepV7})
    assert fast_path_models()[("agent.step", 7)] is False
    data = json.loads(event())
    data.update(type="agent.step", schema_version=7, payload={"run_id": "r"})
    got = same(json.dumps(data).encode(), fast_path=False)
    assert isinstance(got, Row)
    assert '"note":"none"' in got.payload_json


def test_the_fast_path_follows_the_registry(registry: None) -> None:
    """A version registered (a plugin) is fast; once it is gone, the reference decides."""
    from tests.support.payloads_v2 import AgentStartedV2

    data = json.loads(event())
    data.update(
        type="agent.started",
        schema_version=2,
        payload={"run_id": "r", "model": "m", "provider": "p", "max_tokens": 5},
    )
    value = json.dumps(data).encode()
    assert isinstance(same(value, fast_path=False), Rejection)
    register_payloads({("agent.started", 2): AgentStartedV2})
    assert isinstance(same(value, fast_path=True), Row)
    del PAYLOADS[("agent.started", 2)], ENVELOPES[("agent.started", 2)]
    got = same(value, fast_path=False)
    assert isinstance(got, Rejection)
    assert got.reason == "unsupported_version"


def test_canonical_vector_of_canonical_md() -> None:
    value = (
        b'{"event_id": "6a1b3c1e-1f0e-4a8a-9d47-4f3b0f0c7e11", "type": "agent.started", '
        b'"txn_id": "req-42", "agent_id": "a-7", "request_id": "req-42", '
        b'"occurred_at": "2024-05-01T14:00:00+02:00", "schema_version": 1, '
        b'"payload": {"run_id": "run-1", "model": "gpt-x"}}'
    )
    row = same(value, fast_path=True)
    digest = "93e64f4ed6030999a18c5a0ee716d6648bff66ed43607dfe8d78faf99b44b569"
    assert row.body_hash.hex() == digest


_UUID_PIECES = [
    "0",
    "7",
    "a",
    "F",
    "g",
    "-",
    "{",
    "}",
    "urn:uuid:",
    " ",
    "6a1b3c1e",
    "1f0e",
    "4a8a",
]


def _uuid_like(rng: random.Random) -> str:
    """Texts near a UUID: canonical ones, then cut, padded, re-hyphenated or re-cased."""
    base = "6a1b3c1e-1f0e-4a8a-9d47-4f3b0f0c7e11"
    text = rng.choice([base, base.upper(), base.replace("-", ""), "{" + base + "}"])
    for _ in range(rng.randrange(3)):
        at = rng.randrange(len(text) + 1)
        if rng.random() < 0.5:
            text = text[:at] + rng.choice(_UUID_PIECES) + text[at:]
        else:
            text = text[:at] + text[at + 1 :]
    return text


def test_every_event_id_msgspec_accepts_the_model_accepts_with_the_same_value() -> None:
    """The fast path takes ``event_id`` from msgspec's UUID: sound only while what msgspec
    accepts is a subset of what the model's UUID type accepts, with the same value."""
    model = TypeAdapter(_EventId).validate_python  # the model's own UUID type
    parse = msgspec.json.Decoder(uuid.UUID).decode
    rng = random.Random(3)
    accepted = 0
    for _ in range(20_000):
        text = _uuid_like(rng)
        escaped = "".join(f"\\u{ord(c):04x}" for c in text)  # the same text, escaped
        for written in (json.dumps(text), f'"{escaped}"'):
            try:
                got = parse(written.encode())
            except msgspec.ValidationError:
                continue
            accepted += 1
            assert model(text) == got, written
    assert accepted > 1_000  # the sample reaches msgspec's accepted forms


def test_the_body_struct_writes_its_keys_in_sorted_order() -> None:
    fields = list(_Body.__struct_fields__)
    assert fields == sorted(fields)


def test_a_plugin_model_msgspec_cannot_type_goes_slow(registry: None) -> None:
    """Bounds beyond int64 and field names that are no identifiers pass pydantic but not
    msgspec: such a model is the reference's, never an exception out of ``decode``."""

    class HugeV7(Payload):
        seq: Annotated[int, Field(ge=0, le=2**64 - 1)]

    Dashed = create_model("Dashed", __base__=Payload, **{"a-b": (str, ...)})
    register_payloads({("agent.step", 7): HugeV7, ("agent.step", 8): Dashed})
    assert fast_path_models()[("agent.step", 7)] is False
    assert fast_path_models()[("agent.step", 8)] is False
    for version, payload in ((7, {"seq": 5}), (8, {"a-b": "x"})):
        data = json.loads(event())
        data.update(type="agent.step", schema_version=version, payload=payload)
        got = same(json.dumps(data).encode(), fast_path=False)
        assert isinstance(got, Row), got
