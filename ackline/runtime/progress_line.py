"""Progress lines: what a running worker committed, or a processor applied, since the
last line, at INFO.

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
runtimes share it (:class:`ackline.runtime.wiring.Ingest`). `ackline process` logs one
line per processor the same way (:class:`ProcessorsProgress`): events applied, counted
after COMMIT, and its lag; a paused, failed or superseded processor says so once."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

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


def _values(registry: CollectorRegistry) -> Iterator[tuple[str, dict[str, str], float]]:
    """Each value sample of ``registry`` (one collect): its family, labels and value; a
    counter's ``_total`` samples only (its ``_created`` ones are times)."""
    for metric in registry.collect():
        for sample in metric.samples:
            if sample.name in (metric.name, f"{metric.name}_total"):
                yield metric.name, sample.labels, sample.value


def tally(registry: CollectorRegistry) -> Tally:
    """The :class:`Tally` of ``registry`` now: each family's samples summed over their
    labels."""
    by_family = {family: name for name, family in _FAMILIES.items()}
    sums = dict.fromkeys(_FAMILIES, 0.0)
    seen: set[str] = set()
    for family, _, value in _values(registry):
        name = by_family.get(family)
        if name is not None:
            sums[name] += value
            seen.add(name)
    lag = sums.pop("lag")
    return Tally(**sums, lag=lag if "lag" in seen else None)


def progress_line(before: Tally, now: Tally, seconds: float) -> str:
    """The line for what changed from ``before`` to ``now`` over ``seconds``. Pure."""
    parts = _window(
        now.rows - before.rows, now.batches - before.batches, seconds, "rows", "committed"
    )
    parts += _counts(
        (now.duplicates - before.duplicates, "duplicates dropped"),
        (now.conflicts - before.conflicts, "conflicts quarantined"),
        (now.rejects - before.rejects, "rejected"),
        (now.dead_letters - before.dead_letters, "dead-lettered"),
        (now.fenced - before.fenced, "batches fenced"),
    )
    lag = "not measured yet" if now.lag is None else f"{now.lag:,.0f}"
    # the lag is over every partition it tracks, suspended ones too; owned excludes those
    parts.append(f"lag {lag}; {now.owned:.0f} partitions owned")
    return "progress: " + "; ".join(parts)


def _window(n: float, batches: float, seconds: float, what: str, done: str) -> list[str]:
    """The line's head: "N <what> in B batches over the last S s (R/s)", or "nothing
    <done> over the last S s". Pure."""
    if not (n or batches):
        return [f"nothing {done} over the last {seconds:.0f} s"]
    rate = n / seconds if seconds > 0 else 0.0
    per_s = f"{rate:,.0f}/s" if rate >= 10 else f"{rate:.1f}/s"
    return [f"{n:,.0f} {what} in {batches:,.0f} batches over the last {seconds:.0f} s ({per_s})"]


def _counts(*counted: tuple[float, str]) -> list[str]:
    """The counts that are not 0, as one part ("2 rejected, 1 batches fenced"). Pure."""
    said = [f"{n:,.0f} {what}" for n, what in counted if n]
    return [", ".join(said)] if said else []


def worth_saying(before: object, now: object, said_idle: bool, behind: bool) -> bool:
    """Whether a line is due: anything moved since ``before`` (counted, or the lag, or
    what is owned), or it is ``behind`` (a stall is said every time, even with its lag
    standing still); an idle, caught-up one says so once (``said_idle``). Pure."""
    return before != now or not said_idle or behind


class WorkerProgress:
    """The lines of one ingest worker: called every interval with the seconds since the
    last call, it returns the line due, if one is."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry
        self._before = tally(registry)
        self._said_idle = False

    def __call__(self, seconds: float) -> list[str]:
        before, now = self._before, tally(self._registry)
        self._before = now
        if not worth_saying(before, now, self._said_idle, bool(now.lag)):
            return []
        self._said_idle = now.rows == before.rows and now.batches == before.batches
        return [progress_line(before, now, seconds)]


@dataclass(frozen=True)
class ProcessorTally:
    """One processor's counters (since the process started) and gauges (now)."""

    applied: float = 0
    batches: float = 0
    erased: float = 0
    errors: float = 0
    lag_events: float | None = None  # None: not sampled yet
    lag_seconds: float = 0
    paused: bool = False
    failed: bool = False
    superseded: bool = False  # another filter took over: it stopped, its lag frozen

    def settled(self) -> bool:
        """Paused, failed or superseded: said once, not every time it is behind (its lag
        is not the news, and a superseded one's is no longer sampled)."""
        return self.paused or self.failed or self.superseded

    def news(self) -> tuple[object, ...]:
        """What moves a line: not the lag's age, which every sample changes while any
        lag is left, nor, while it is settled, the lag itself."""
        lag = None if self.settled() else self.lag_events
        return (
            self.applied,
            self.batches,
            self.erased,
            self.errors,
            lag,
            self.paused,
            self.failed,
            self.superseded,
        )


def processor_tallies(registry: CollectorRegistry, names: list[str]) -> dict[str, ProcessorTally]:
    """The :class:`ProcessorTally` of each processor of ``names`` in ``registry`` (the
    families of ``ackline.sinks.feed.processors.metrics``) now, in one collect."""
    found: dict[str, dict[str, float]] = {n: {} for n in names}
    for family, labels, value in _values(registry):
        got = found.get(labels.get("processor", ""))
        if got is None:
            continue
        key = family.removeprefix("ackline_processor_")
        if family == "ackline_processor_errors":
            key = f"errors:{labels.get('kind', '')}"
        got[key] = got.get(key, 0.0) + value

    def one(got: dict[str, float]) -> ProcessorTally:
        errors = {k: v for k, v in got.items() if k.startswith("errors:")}
        return ProcessorTally(
            applied=got.get("events", 0.0),
            batches=got.get("batches", 0.0),
            erased=got.get("erasure_notices", 0.0),
            errors=sum(errors.values()),
            lag_events=got.get("lag_events"),
            lag_seconds=got.get("lag_seconds", 0.0),
            paused=bool(got.get("paused")),
            failed=bool(got.get("failed")),
            superseded=errors.get("errors:superseded", 0.0) > 0,
        )

    return {n: one(got) for n, got in found.items()}


def processor_line(name: str, before: ProcessorTally, now: ProcessorTally, seconds: float) -> str:
    """The line for processor ``name`` from ``before`` to ``now`` over ``seconds``. Pure."""
    applied, batches = now.applied - before.applied, now.batches - before.batches
    parts = _window(applied, batches, seconds, "events applied", "applied")
    parts += _counts(
        (now.erased - before.erased, "erasure notices handed"),
        (now.errors - before.errors, "errors"),
    )
    if now.lag_events is None:
        parts.append("lag not measured yet")
    else:
        parts.append(f"lag {now.lag_events:,.0f} events ({now.lag_seconds:,.0f} s)")
    # a superseded one's failed gauge is set too; it did not fail at an event
    failed = ("superseded", now.superseded) if now.superseded else ("failed", now.failed)
    state = [word for word, on in (("paused", now.paused), failed) if on]
    return f"progress: processor {name}: " + "; ".join(parts + state)


class ProcessorsProgress:
    """The lines of `ackline process`: one per processor that has one due."""

    def __init__(self, registry: CollectorRegistry, names: list[str]) -> None:
        self._registry = registry
        self._names = names
        self._before = processor_tallies(registry, names)
        self._said_idle = dict.fromkeys(names, False)

    def __call__(self, seconds: float) -> list[str]:
        lines = []
        tallies = processor_tallies(self._registry, self._names)
        for name, now in tallies.items():
            before = self._before[name]
            behind = bool(now.lag_events) and not now.settled()
            if worth_saying(before.news(), now.news(), self._said_idle[name], behind):
                self._said_idle[name] = now.applied == before.applied
                lines.append(processor_line(name, before, now, seconds))
        self._before = tallies
        return lines


class ProgressLog:
    """A daemon thread that logs the lines ``lines`` returns every ``every_s`` (0:
    never; ``lines`` gets the seconds since its last call). A thread of its own, not a
    task of the command's loop: both runtimes and `process` get it the same way, and a
    loop busy with a batch does not delay it."""

    def __init__(self, lines: Callable[[float], list[str]], every_s: float) -> None:
        self._lines = lines
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._every_s <= 0 or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="ackline-progress", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """No line after this returns (the command's stop line is the last)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=5)

    def _run(self) -> None:
        at = time.monotonic()
        while not self._stop.wait(self._every_s):
            now_at = time.monotonic()
            for line in self._lines(now_at - at):
                log.info(line)
            at = now_at
