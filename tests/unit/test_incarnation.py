"""The topic-incarnation check's pure parts (sinks/ingest/incarnation.py, kafkainfo)."""

from __future__ import annotations

import base64
import uuid

import pytest

from ackline.sinks.ingest.incarnation import (
    Judged,
    Recorded,
    Verdict,
    judge,
    other_incarnation_line,
    verdict,
)
from ackline.streams.kafkainfo import kafka_uuid_text


@pytest.mark.parametrize(
    ("found", "expected"),
    [
        (Recorded("A", recorded=False, offset_rows=3), Verdict.SAME),
        (Recorded("A", recorded=True, offset_rows=0), Verdict.FIRST),
        (Recorded("A", recorded=True, offset_rows=3), Verdict.UPGRADE),
        (Recorded("B", recorded=False, offset_rows=3), Verdict.OTHER),
        # another incarnation's ID, even with no offsets yet: the operator adopts
        (Recorded("B", recorded=False, offset_rows=0), Verdict.OTHER),
    ],
)
def test_verdict(found: Recorded, expected: Verdict) -> None:
    assert verdict("A", found) is expected


def test_judge_refuses_another_incarnation_and_notes_only_an_id_recorded_now() -> None:
    """The start and the running watch read a verdict through this one function."""
    other = judge("t", "g", "A", Recorded("B", recorded=False, offset_rows=3))
    assert other == Judged(other_incarnation_line("t", "g", "B", "A"), None)
    assert judge("t", "g", "A", Recorded("A", recorded=False, offset_rows=3)) == Judged(None, None)
    first = judge("t", "g", "A", Recorded("A", recorded=True, offset_rows=0))
    assert first.refusal is None and first.note is not None and "A" in first.note
    upgrade = judge("t", "g", "A", Recorded("A", recorded=True, offset_rows=3))
    assert upgrade.refusal is None and upgrade.note is not None
    assert "3 DB offsets" in upgrade.note and "group g" in upgrade.note


def test_the_refusal_names_topic_both_ids_group_and_the_fix() -> None:
    line = other_incarnation_line("t", "g", "OLD", "NEW")
    assert "\n" not in line
    for part in ("topic t", "group g", "OLD", "NEW", "ackline offsets adopt-topic"):
        assert part in line, part
    assert "--topic t --group-id g" in line


def test_kafka_uuid_text_is_kafkas_url_safe_unpadded_base64() -> None:
    u = uuid.UUID("d00a45ac-15a6-488f-a013-5f119b6f5934")
    most, least = u.int >> 64, u.int & (2**64 - 1)
    signed = [x - 2**64 if x >= 2**63 else x for x in (most, least)]
    text = kafka_uuid_text(*signed)
    assert text == base64.urlsafe_b64encode(u.bytes).decode().rstrip("=")
    assert text is not None and "+" not in text and "/" not in text and len(text) == 22


def test_the_zero_uuid_is_no_topic_id() -> None:
    assert kafka_uuid_text(0, 0) is None
