"""The progress lines of workers and processors (ackline.runtime.progress_line): what
they say, and when."""

from __future__ import annotations

from ackline.core.metrics import Metrics
from ackline.runtime.progress_line import (
    ProcessorsProgress,
    Tally,
    WorkerProgress,
    progress_line,
    tally,
)
from ackline.sinks.feed.processors.metrics import ProcessorMetrics


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


def test_an_idle_worker_says_so_once_and_a_worker_behind_every_time() -> None:
    """A stalled worker (PostgreSQL away, its partitions suspended or held, its consumer
    wedged) with a lag that stood still said "nothing committed" once and then nothing
    for ever: the silence this line exists to end. Only a caught-up worker goes quiet."""
    m = Metrics()
    lines = WorkerProgress(m.registry)
    assert lines(60) == [
        "progress: nothing committed over the last 60 s; lag not measured yet; 0 partitions owned"
    ]
    assert lines(60) == []  # not measured, nothing moved: quiet
    m.assigned.set(3)
    m.lag.labels("t", "0").set(0)
    assert lines(60) == [
        "progress: nothing committed over the last 60 s; lag 0; 3 partitions owned"
    ]
    assert lines(60) == []
    m.lag.labels("t", "0").set(900)  # nothing committed, the lag grows, then stands
    assert len(lines(60)) == 1
    assert lines(60) == [
        "progress: nothing committed over the last 60 s; lag 900; 3 partitions owned"
    ]
    m.lag.labels("t", "0").set(0)
    m.ingested.inc(6)
    m.batches.inc()
    assert lines(60) == [
        "progress: 6 rows in 1 batches over the last 60 s (0.1/s); lag 0; 3 partitions owned"
    ]
    assert lines(60) == [
        "progress: nothing committed over the last 60 s; lag 0; 3 partitions owned"
    ]
    assert lines(60) == []


def test_a_processor_says_what_it_applied_and_a_pause_once() -> None:
    m = ProcessorMetrics()
    lines = ProcessorsProgress(m.registry, ["runs", "agg"])
    assert lines(60) == [
        "progress: processor runs: nothing applied over the last 60 s; lag not measured yet",
        "progress: processor agg: nothing applied over the last 60 s; lag not measured yet",
    ]
    m.applied.labels("runs").inc(1_200)
    m.batches.labels("runs").inc(4)
    m.errors.labels("runs", "transient").inc()
    m.lag_events.labels("runs").set(0)
    m.lag_seconds.labels("runs").set(0)
    assert lines(60) == [
        "progress: processor runs: 1,200 events applied in 4 batches over the last 60 s "
        "(20/s); 1 errors; lag 0 events (0 s)"
    ]
    m.paused.labels("runs").set(1)
    m.lag_events.labels("runs").set(50)
    m.lag_seconds.labels("runs").set(30)
    assert lines(60) == [
        "progress: processor runs: nothing applied over the last 60 s; lag 50 events (30 s); paused"
    ]
    # paused: said once, though every lag sample ages the lag and ingest grows it (a
    # review: the age moved the line every sample, so a pause was said every minute)
    for age in (35, 40):
        m.lag_seconds.labels("runs").set(age)
        m.lag_events.labels("runs").inc(10)
        assert lines(60) == []
    m.paused.labels("runs").set(0)
    assert len(lines(60)) == 1  # resumed and behind: said every time
    assert len(lines(60)) == 1


def test_a_superseded_processor_says_so_once_and_not_failed() -> None:
    """Superseded, a processor's lag is no longer sampled and its failed gauge is set:
    the line repeated a frozen lag every interval and called it failed."""
    m = ProcessorMetrics()
    lines = ProcessorsProgress(m.registry, ["runs"])
    m.lag_events.labels("runs").set(70)
    m.lag_seconds.labels("runs").set(9)
    assert len(lines(60)) == 1
    m.errors.labels("runs", "superseded").inc()
    m.failed.labels("runs").set(1)
    assert lines(60) == [
        "progress: processor runs: nothing applied over the last 60 s; 1 errors; lag 70 "
        "events (9 s); superseded"
    ]
    assert lines(60) == []
    assert lines(60) == []
