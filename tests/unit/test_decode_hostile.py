"""Hostile-input regressions found by the fuzz test: a number too large for a double is
refused (never stored as something else), and the nesting answer is deterministic.

Found by tests/integration/test_fuzz_pipeline.py: ``1e400`` parsed to ``inf``, passed the
fast path (which trusts the parser to refuse non-finite numbers) and was stored as
``null`` - an accepted event whose body had silently changed.
"""

from __future__ import annotations

import json

import pytest

from ackline.schemas import Limits, Rejection, Row, decode, new_envelope


def _tool_called(arguments_text: str) -> bytes:
    env = new_envelope(
        "tool.called",
        "t-1",
        "a",
        "r",
        {"run_id": "r", "call_id": "c", "tool": "t", "arguments": {"x": 0}},
    )
    return json.dumps(env.model_dump(mode="json")).replace('{"x": 0}', arguments_text).encode()


@pytest.mark.parametrize("literal", ["1e400", "-1E+999", "1.5e308000"])
def test_overflowing_number_is_non_finite(literal: str) -> None:
    got = decode(_tool_called('{"x": ' + literal + "}"))
    assert isinstance(got, Rejection)
    assert got.reason == "non_finite_number"
    assert literal[:10] in got.detail


def test_large_but_finite_numbers_still_decode() -> None:
    """``1e-400`` (read as 0.0) is now ``inexact_number``: tests/unit/test_decode_numbers.py."""
    got = decode(_tool_called('{"x": 1e308, "y": 5e-324, "z": 123456789012345678901234567890}'))
    assert isinstance(got, Row)
    assert json.loads(got.payload_json)["arguments"] == {
        "x": 1e308,
        "y": 5e-324,
        "z": 123456789012345678901234567890,
    }


def _at_stack_depth(frames: int, value: bytes) -> Rejection | Row:
    if frames == 0:
        return decode(value, Limits(max_bytes=100_000))
    return _at_stack_depth(frames - 1, value)


@pytest.mark.parametrize("depth", [513, 700, 900, 990])
def test_deep_nesting_answer_does_not_depend_on_the_callers_stack(depth: int) -> None:
    """Found by the fuzz test: a top-level array ~950 deep was too_deep in the test process
    (deep stack: the parser hit the recursion limit) and invalid_json in the worker thread."""
    value = b"[" * depth + b"]" * depth
    answers = {_reason(_at_stack_depth(frames, value)) for frames in (0, 300, 700)}
    assert answers == {"too_deep"}
    strings = b'{"a": "' + b"[" * depth + b'"}'  # brackets inside a string do not nest
    assert {_reason(_at_stack_depth(f, strings)) for f in (0, 700)} == {"schema_invalid"}


def _reason(got: Rejection | Row) -> str:
    assert isinstance(got, Rejection)
    return got.reason
