"""The size of a changefeed read after the server cancelled reads (follow's ReadCap)."""

from __future__ import annotations

from ackline.sinks.feed.follow import ReadCap


def test_each_cancel_halves_down_to_one_then_says_so() -> None:
    cap = ReadCap(10)
    sizes = []
    while cap.cancelled(None):
        sizes.append(cap.size)
    assert sizes == [5, 2, 1] and cap.size == 1
    assert not cap.cancelled(None)  # still one


def test_it_halves_what_was_asked_not_the_cap() -> None:
    cap = ReadCap(5_000)
    assert cap.cancelled(6) and cap.size == 3  # a --limit of 6 asked for 6
    assert cap.cancelled(None) and cap.size == 1


def test_it_grows_back_only_after_a_run_of_answered_reads() -> None:
    cap = ReadCap(8)
    cap.cancelled(None)
    cap.cancelled(None)
    assert cap.size == 2
    for _ in range(ReadCap.GROW_AFTER - 1):
        cap.read(2)
    cap.read(0)  # an empty read (caught up) proves nothing
    assert cap.size == 2
    cap.read(1)
    assert cap.size == 4
    for _ in range(ReadCap.GROW_AFTER - 1):
        cap.read(4)
    cap.cancelled(None)  # a cancel restarts the count
    assert cap.size == 2
    for _ in range(3 * ReadCap.GROW_AFTER):
        cap.read(2)
    assert cap.size == 8  # never past the full size
