"""The consumer's per-call record count: bounded by the batch's count and its bytes."""

from __future__ import annotations

from ackline.streams.fetchsize import CALL_CAP, fetch_room, next_size_hint


def test_small_records_take_whole_calls() -> None:
    assert fetch_room(2_000, 8 << 20, 600.0) == CALL_CAP
    assert fetch_room(120, 8 << 20, 600.0) == 120


def test_large_records_take_what_the_bytes_left_hold() -> None:
    assert fetch_room(2_000, 1 << 20, 300_000.0) == 3
    assert fetch_room(2_000, 8 << 20, float(1 << 20)) == 8


def test_a_batch_always_moves() -> None:
    assert fetch_room(2_000, 10, 300_000.0) == 1
    assert fetch_room(2_000, 1 << 20, 0.0) == CALL_CAP


def test_the_hint_jumps_to_a_large_record_and_decays_after_it() -> None:
    hint = next_size_hint(600.0, 1 << 20)
    assert hint == 1 << 20
    for _ in range(700):
        hint = next_size_hint(hint, 600)
    assert 600 <= hint < 1_000
    assert next_size_hint(600.0, 500) == 600 * 0.99
