"""The differential test of the decoder (tests/support/decode_diff.py), on a sample.

``make decode-diff`` runs it whole (about 1.1 million inputs, ~15 minutes); here a sample
of every source runs in a few seconds, and deliberately broken fast paths show that the
harness notices what it is there to notice.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from ackline.core.tuples import builder
from ackline.schemas import decode_fast, exact
from ackline.schemas.decode import MAX_SUPPORTED_DEPTH, Limits, Row
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


def test_exact_copies_stand_for_the_decoder_only_where_a_ledger_could_vouch() -> None:
    tally = decode_diff.run(SAMPLE, seed=13)
    assert tally.mismatches == [], decode_diff.report(tally, 0)
    # the realistic records are an SDK's (canonical), and mutations reach the check too
    assert tally.exact_checked["realistic"] > 0.9 * tally.inputs["realistic"]
    assert sum(n for s, n in tally.exact_checked.items() if s.startswith("mut:")) > 100


_LAX_HEAD = re.compile(rb'\{"agent_id":"[^"\\]*",("event_id":"[^"]{30,40}",)"occurred_at":"')


@pytest.mark.parametrize("broken", ["any 36 characters as an event_id", "no depth guard"])
def test_the_harness_catches_a_broken_exact_form(
    broken: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if broken.startswith("any"):
        monkeypatch.setattr(exact, "_HEAD", _LAX_HEAD)
    else:
        real = exact.exact_form
        monkeypatch.setattr(
            exact,
            "exact_form",
            lambda value, limits: real(value, Limits(limits.max_bytes, MAX_SUPPORTED_DEPTH)),
        )
    tally = decode_diff.run(0.002, seed=5)
    assert any(m[0].startswith("exact:") for m in tally.mismatches), f"{broken}: not caught"
