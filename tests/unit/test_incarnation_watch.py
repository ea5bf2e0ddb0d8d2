"""The running watch's gate (ackline.runtime.incarnation_watch): a held partition is
released only after a read of the topic ID that began once it was due; the reads
themselves, against Kafka and PostgreSQL, are tests/integration/test_recreated_topic.py."""

from __future__ import annotations

from ackline.runtime.incarnation_watch import IncarnationWatch
from ackline.sinks.ingest.incarnation import Confirmed


def _watch() -> IncarnationWatch:
    return IncarnationWatch("127.0.0.1:1", {}, "t", "g", "postgresql://x", 1.0, "w")


def test_nothing_is_held_back_before_a_first_confirmation() -> None:
    """Unchecked (the ID unreadable, no migration 0015): as before the watch."""
    assert _watch().fresh_since(100.0)


def test_a_release_waits_for_a_read_begun_after_it_was_due() -> None:
    w = _watch()
    w.confirmed, w.confirmed_at = "A", 50.0
    assert not w.fresh_since(100.0)  # confirmed before the log end reached the offset
    assert w.fresh_since(50.0)
    w.confirmed_at = 101.0
    assert w.fresh_since(100.0)


def test_nothing_is_released_once_another_incarnation_was_found() -> None:
    w = _watch()
    w.confirmed, w.confirmed_at = "A", 200.0
    w.refusal = "topic t is another incarnation"
    assert not w.fresh_since(100.0)


def test_the_starts_confirmed_id_is_the_baseline_and_needs_no_second_record() -> None:
    w = _watch()
    w.start_from(None)  # the start could not read or check it: the first read is checked
    assert w.confirmed is None and w.fresh_since(100.0)
    w.start_from(Confirmed("A", 40.0))
    assert w.confirmed == "A" and w.confirmed_at == 40.0
    assert not w.fresh_since(100.0)  # read before the partition was due
    assert w.fresh_since(40.0)
