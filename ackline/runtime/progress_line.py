"""A running worker's progress line: what it committed since the last line, at INFO.

Metrics answer "how is it going" for a scraper; an operator tailing a worker's log saw
nothing between the start-up line and the stop while events flowed (or did not). So every
``ACKLINE_PROGRESS_LOG_S`` the worker logs one line from its own metrics: rows and batches
committed since the last line and their rate, duplicates, conflicts, rejects, dead letters
and fenced batches, its lag and the partitions it owns. An idle, caught-up worker says so
once, then stays quiet until something changes; one behind says so every time. Rows,
batches, duplicates, conflicts and rejects are counted after the DB commit, so those are
never what PostgreSQL has not acknowledged; dead letters are counted when Kafka
acknowledges them (before their batch commits, so a batch fenced after that counts its
dead letters again when it is read again), fenced batches at their rollback. Both
runtimes share it (:class:`ackline.runtime.wiring.Ingest`)."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, fields

from prometheus_client import CollectorRegistry

log = logging.getLogger(__name__)

# The metric families (ackline.core.metrics) each field sums, every label together.
_FAMILIES = {
    "rows": "ackline_ingested_rows",
    "batches": "ackline_batches",
    "duplicates": "ackline_duplicates",
    "conflicts": "ackline_conflicts",
    "rejects": "ackline_rejects",
    "dead_letters": "ackline_dead_letters",
    "fenced": "ackline_fenced_batches",
    "lag": "ackline_partition_lag",
    "owned": "ackline_assigned_partitions",
}


@dataclass(frozen=True)
class Tally:
    """The worker's counters (since it started) and gauges (now) at one moment."""

    rows: float = 0
    batches: float = 0
    duplicates: float = 0
    conflicts: float = 0
    rejects: float = 0
    dead_letters: float = 0
    fenced: float = 0
    lag: float | None = None  # None: not measured yet (no partition's gauge is set)
    owned: float = 0


def tally(registry: CollectorRegistry) -> Tally:
    """The :class:`Tally` of ``registry`` now: each family's samples summed over their
    labels (a counter's ``_total`` samples only; its ``_created`` ones are times)."""
    by_family = {family: name for name, family in _FAMILIES.items()}
    sums = dict.fromkeys(_FAMILIES, 0.0)
    seen: set[str] = set()
    for metric in registry.collect():
        name = by_family.get(metric.name)
        if name is None:
            continue
        for sample in metric.samples:
            if sample.name in (metric.name, f"{metric.name}_total"):
                sums[name] += sample.value
                seen.add(name)
    lag = sums.pop("lag")
    return Tally(**sums, lag=lag if "lag" in seen else None)


def progress_line(before: Tally, now: Tally, seconds: float) -> str:
    """The line for what changed from ``before`` to ``now`` over ``seconds``. Pure."""
    rows = now.rows - before.rows
    batches = now.batches - before.batches
    rate = rows / seconds if seconds > 0 else 0.0
    parts = [f"nothing committed over the last {seconds:.0f} s"]
    if rows or batches:
        parts = [f"{rows:,.0f} rows in {batches:,.0f} batches over the last {seconds:.0f} s"]
        parts[0] += f" ({rate:,.0f}/s)" if rate >= 10 else f" ({rate:.1f}/s)"
    others = [
        (now.duplicates - before.duplicates, "duplicates dropped"),
        (now.conflicts - before.conflicts, "conflicts quarantined"),
        (now.rejects - before.rejects, "rejected"),
        (now.dead_letters - before.dead_letters, "dead-lettered"),
        (now.fenced - before.fenced, "batches fenced"),
    ]
    said = [f"{n:,.0f} {what}" for n, what in others if n]
    if said:
        parts.append(", ".join(said))
    lag = "not measured yet" if now.lag is None else f"{now.lag:,.0f}"
    # the lag is over every partition it tracks, suspended ones too; owned excludes those
    parts.append(f"lag {lag}; {now.owned:.0f} partitions owned")
    return "progress: " + "; ".join(parts)


def worth_saying(before: Tally, now: Tally, said_idle: bool) -> bool:
    """Whether a line is due: anything counted since ``before``, or the lag or the
    partitions owned moved, or the worker is behind (a stall is said every time, even
    with its lag standing still); an idle, caught-up worker says so once (``said_idle``).
    Pure."""
    moved = any(getattr(now, f.name) != getattr(before, f.name) for f in fields(Tally))
    return moved or not said_idle or bool(now.lag)


class ProgressLog:
    """A daemon thread that logs :func:`progress_line` every ``every_s`` (0: never). A
    thread of its own, not a task of either runtime's loop: both runtimes get it the same
    way, and a loop busy with a batch does not delay it."""

    def __init__(self, registry: CollectorRegistry, every_s: float) -> None:
        self._registry = registry
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._every_s <= 0 or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="ackline-progress", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """No line after this returns (the worker's stop line is the last)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=5)

    def _run(self) -> None:
        before, at = tally(self._registry), time.monotonic()
        said_idle = False
        while not self._stop.wait(self._every_s):
            now, now_at = tally(self._registry), time.monotonic()
            if worth_saying(before, now, said_idle):
                idle = now.rows == before.rows and now.batches == before.batches
                log.info(progress_line(before, now, now_at - at))
                said_idle = idle
            before, at = now, now_at
