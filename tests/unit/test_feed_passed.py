"""A read's transaction count (sinks/feed/types.passed): a read cut inside its window
passed only the transactions before the one it ended in."""

from __future__ import annotations

from ackline.sinks.feed.types import Cursor, Position, passed


def test_a_cut_read_counts_the_transactions_before_its_end() -> None:
    inside = Cursor(20, Position(batch_id=7, partition=0, offset=3, topic="t"))
    assert passed([10, 20, 30], inside) == 1
    assert passed([20, 30], inside) == 0  # cut inside the first one: none passed


def test_an_uncut_read_counts_its_whole_window() -> None:
    assert passed([10, 20, 30], Cursor(30)) == 3
    assert passed([], Cursor(5)) == 0
