"""The worker's progress line (ackline.runtime.progress_line): what it says, and when."""

from __future__ import annotations

from ackline.core.metrics import Metrics
from ackline.runtime.progress_line import Tally, progress_line, tally, worth_saying


def test_the_tally_sums_every_label_and_knows_an_unmeasured_lag() -> None:
    m = Metrics()
    m.precreate(("ledger", "activity"), ("invalid_json",), ("transient",))
    first = tally(m.registry)
    assert first == Tally()
    assert first.lag is None  # no partition's gauge is set yet: not "lag 0"
    m.ingested.inc(1_500)
    m.batches.inc(2)
    m.duplicates.labels("ledger").inc(3)
    m.duplicates.labels("activity").inc(4)
    m.lag.labels("t", "0").set(10)
    m.lag.labels("t", "1").set(5)
    m.assigned.set(2)
    assert tally(m.registry) == Tally(rows=1_500, batches=2, duplicates=7, lag=15, owned=2)


def test_the_line_says_what_changed_since_the_last() -> None:
    before = Tally(rows=100, batches=1, duplicates=1, lag=40, owned=3)
    now = Tally(rows=6_100, batches=4, duplicates=3, conflicts=1, fenced=1, lag=0, owned=3)
    assert progress_line(before, now, 60) == (
        "progress: 6,000 rows in 3 batches over the last 60 s (100/s); 2 duplicates "
        "dropped, 1 conflicts quarantined, 1 batches fenced; lag 0; 3 partitions owned"
    )
    assert progress_line(now, now, 60) == (
        "progress: nothing committed over the last 60 s; lag 0; 3 partitions owned"
    )
    assert "(0.1/s)" in progress_line(Tally(), Tally(rows=6, batches=1), 60)
    assert "lag not measured yet" in progress_line(Tally(), Tally(), 60)


def test_an_idle_worker_says_so_once_and_a_growing_lag_always() -> None:
    idle = Tally(rows=5, batches=1, lag=0, owned=3)
    assert worth_saying(idle, idle, said_idle=False)
    assert not worth_saying(idle, idle, said_idle=True)
    stuck = Tally(rows=5, batches=1, lag=900, owned=3)  # nothing committed, lag grows
    assert worth_saying(idle, stuck, said_idle=True)
    assert worth_saying(idle, Tally(rows=6, batches=2, lag=0, owned=3), said_idle=True)


def test_a_worker_behind_that_commits_nothing_says_so_every_time() -> None:
    """A stalled worker (PostgreSQL away, its partitions suspended or held, its consumer
    wedged) with a lag that stood still said "nothing committed" once and then nothing
    for ever: the silence this line exists to end. Only a caught-up worker goes quiet."""
    stuck = Tally(rows=5, batches=1, lag=900, owned=3)
    assert worth_saying(stuck, stuck, said_idle=True)
    assert not worth_saying(Tally(owned=3), Tally(owned=3), said_idle=True)  # not measured
