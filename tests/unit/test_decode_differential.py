"""The differential test of the decoder (tests/support/decode_diff.py), on a sample.

``make decode-diff`` runs it whole (about 1.1 million inputs, ~15 minutes); here a sample
of every source runs in a few seconds, and deliberately broken fast paths show that the
harness notices what it is there to notice.
"""

from __future__ import annotations

from typing import Any

import pytest

from ackline.core.tuples import builder
from ackline.schemas import decode_fast
from ackline.schemas.decode import Row
from ackline.schemas.numbers import finite_float
from tests.support import decode_diff

SAMPLE = 0.005


def test_the_fast_path_equals_the_reference_on_a_sample_of_every_source() -> None:
    tally = decode_diff.run(SAMPLE, seed=11)
    assert tally.mismatches == [], decode_diff.report(tally, 0)
    sources = {"realistic", "poison", "random_args", "limits", "bytes", "hypothesis"}
    assert sources | {f"mut:{m[0]}" for m in decode_diff.TREE_MUTATIONS} <= set(tally.inputs)
    assert tally.fast_hits["realistic"] / tally.inputs["realistic"] > 0.99
    reasons = {what for (_, what), _ in tally.outcomes.items()}
    assert {"row", "duplicate_key", "inexact_number", "too_deep", "schema_invalid"} <= reasons


def _without_the_number_rule(slow: decode_diff.Decoder) -> decode_diff.Decoder:
    return decode_fast.make_fast_decoder(slow, builder(Row), finite_float)


@pytest.mark.parametrize(
    ("broken", "patch"),
    [
        ("float hook without the number rule", None),
        ("no duplicate-key proof", ("_no_duplicates", lambda *_: True)),
        ("no id length check", ("_Ident", str)),
    ],
)
def test_the_harness_catches_a_broken_fast_path(
    broken: str, patch: tuple[str, Any] | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = decode_diff.default_fast
    if patch is None:
        fast = _without_the_number_rule
    else:
        monkeypatch.setattr(decode_fast, *patch)
    tally = decode_diff.run(0.002, seed=5, fast=fast)
    assert tally.mismatches, f"{broken}: not caught"
