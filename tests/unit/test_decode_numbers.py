"""Issue 11, item 7: numbers that change meaning (schemas/CANONICAL.md, "Numbers").

Before: ``12345678901234567890.5`` and ``12345678901234567000.0`` gave the same body hash
(both read as the double 1.2345678901234567e+19) and the payload was stored rounded;
``1e-400`` read as ``0.0`` while ``1e400`` was rejected. A changed replay could pass as a
duplicate, and a stored tool argument was not what was sent. Now a literal with a fraction
or an exponent is accepted only if the double it reads as holds exactly its value; else
the record is rejected as ``inexact_number``. Everything accepted hashes as before.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from ackline.schemas import Rejection, Row, decode, hash_envelope, new_envelope

_AT = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def _tool_called(arguments_text: str) -> bytes:
    env = new_envelope(
        "tool.called",
        "t-1",
        "a",
        "r",
        {"run_id": "r", "call_id": "c", "tool": "t", "arguments": {"x": 0}},
        occurred_at=_AT,
    )
    return json.dumps(env.model_dump(mode="json")).replace('{"x": 0}', arguments_text).encode()


def _reason(result: Row | Rejection) -> str:
    return result.reason if isinstance(result, Rejection) else "row"


def test_item_7_literals_that_differ_do_not_hash_the_same() -> None:
    sent = decode(_tool_called('{"amount": 12345678901234567890.5}'))
    rounded = decode(_tool_called('{"amount": 12345678901234567000.0}'))
    assert isinstance(rounded, Row)
    assert isinstance(sent, Rejection), (
        "12345678901234567890.5 was accepted as "
        f"{json.loads(sent.payload_json)['arguments']['amount']!r}, with the hash of "
        f"12345678901234567000.0: {sent.body_hash == rounded.body_hash}"
    )
    assert sent.reason == "inexact_number"
    assert "12345678901234567890.5" in sent.detail
    assert "1.2345678901234567e+19" in sent.detail


def test_item_7_underflow_is_rejected_not_read_as_zero() -> None:
    got = decode(_tool_called('{"y": 1e-400}'))
    assert isinstance(got, Rejection), f"1e-400 was stored as {got.payload_json}"
    assert got.reason == "inexact_number"
    assert "0.0" in got.detail


@pytest.mark.parametrize(
    "literal",
    [
        "12345678901234567890.5",
        "1e-400",
        "-1e-400",
        "2.5e-324",
        "9007199254740993.0",
        "1.7976931348623158e308",
        "0.10000000000000001",
        "4.3500000000000001",
        "9.999999999999999e22",
        "1.0000000000000000000000000001",
        "1e-99999999999999999999999",
    ],
)
def test_item_7_inexact_literals_are_rejected(literal: str) -> None:
    for text in (f'{{"x": {literal}}}', f'{{"x": [1, {{"y": {literal}}}]}}'):
        assert _reason(decode(_tool_called(text))) == "inexact_number", text


@pytest.mark.parametrize(
    "literal",
    [
        "0.1",
        "1E2",
        "1e2",
        "1.0E2",
        "100.00",
        "1e-07",
        "1e-7",
        "-0.0",
        "0e-400",
        "-0e-99999999999999999999999",
        "0.000",
        "5e-324",
        "1.7976931348623157e308",
        "1.0000000000000001e23",
        "0.30000000000000004",
        "3.141592653589793",
        "123456789012345.6",
        "12345678901234567000.0",
        "1e22",
    ],
)
def test_item_7_exact_literals_keep_their_hash(literal: str) -> None:
    """Accepted, and hashed exactly as the producer SDK hashes the float they read as."""
    got = decode(_tool_called(f'{{"x": {literal}}}'))
    assert isinstance(got, Row), got
    env = new_envelope(
        "tool.called",
        "t-1",
        "a",
        "r",
        {"run_id": "r", "call_id": "c", "tool": "t", "arguments": {"x": float(literal)}},
        occurred_at=_AT,
    )
    assert got.body_hash == hash_envelope(env)


def test_item_7_integers_are_exact_at_any_size() -> None:
    big = "123456789012345678901234567890"
    got = decode(_tool_called(f'{{"z": {big}, "w": -{big}}}'))
    assert isinstance(got, Row)
    assert f'"w":-{big}' in got.payload_json
    assert f'"z":{big}' in got.payload_json


def test_item_7_minus_zero_is_kept_and_differs_from_zero() -> None:
    """-0.0 is a double of its own: hashed as ``-0.0`` (CANONICAL.md); jsonb stores 0.0."""
    minus, plus = (decode(_tool_called(f'{{"x": {v}}}')) for v in ("-0.0", "0.0"))
    assert isinstance(minus, Row)
    assert isinstance(plus, Row)
    assert '"x":-0.0' in minus.payload_json
    assert minus.body_hash != plus.body_hash


def test_item_7_strings_are_not_normalised() -> None:
    """NFC and NFD spellings are different bodies (CANONICAL.md): no Unicode normalisation."""
    nfc, nfd = (decode(_tool_called(json.dumps({"q": v}))) for v in ("caf\u00e9", "cafe\u0301"))
    assert isinstance(nfc, Row)
    assert isinstance(nfd, Row)
    assert "caf\u00e9" in nfc.payload_json
    assert "cafe\u0301" in nfd.payload_json
    assert nfc.body_hash != nfd.body_hash


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        ('{"x": 1e-400, "y": NaN}', "non_finite_number"),
        ('{"x": 1e-400, "y": 1e400}', "non_finite_number"),
        ('{"x": 1e-400, "x": 1}', "duplicate_key"),
        ('{"x": 1e-400, "y": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}', (
            "inexact_number"
        )),
    ],
)  # fmt: skip
def test_item_7_inexact_number_comes_after_non_finite_and_before_too_deep(
    arguments: str, reason: str
) -> None:
    assert _reason(decode(_tool_called(arguments))) == reason
