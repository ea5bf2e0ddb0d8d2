"""What a reader is told of retention's drops (gaps.Told): each drop once, a new one
measured from the cursor of the reader's last look."""

from __future__ import annotations

from datetime import UTC, datetime

from ackline.sinks.feed.gaps import Drop, Told
from ackline.sinks.feed.types import START, Cursor


def _drop(drop_id: int, up_to: int) -> Drop:
    return Drop(
        drop_id, f"activity_p{drop_id}", datetime(2026, 12, 1, tzinfo=UTC), (), Cursor(up_to)
    )


def test_a_drop_is_told_once_however_often_the_reader_starts() -> None:
    told = Told()
    recorded = [_drop(1, 10)]
    assert told.news(recorded, START) == (START, recorded)
    assert told.news(recorded, START) == (START, [])  # the runner follows again: not again


def test_a_drop_made_since_the_last_look_is_measured_from_that_look() -> None:
    told = Told()
    assert told.news([], Cursor(5)) == (Cursor(5), [])  # started at 5, nothing dropped
    # read on to 20 before the look that finds drop 2 (up to 10): it may have gone before
    # the reader passed 10, so it is told, from 5
    here, lost = told.news([_drop(2, 10)], Cursor(20), newest=2)
    assert (here, [d.drop_id for d in lost], told.seen) == (Cursor(5), [2], 2)
    # one up to 15, found at the next look (the cursor was 20 then): it took nothing unread
    assert told.news([_drop(3, 15)], Cursor(30), newest=3) == (Cursor(20), [])
    # one that took no batch's rows (up_to NULL: not read) is looked at once all the same
    assert told.news([], Cursor(30), newest=4) == (Cursor(30), [])
    assert told.seen == 4
