"""Where a verdict's lost events were: the evidence to find out why.

A verdict counts the winners that have no row (:mod:`ackline.load.verify`); the stack of
a failed chaos run is often gone by the time anyone reads it (CI keeps only the output).
So for each run of lost winners on a partition (winners next to each other in the
manifest's committed records, none between them stored) this names the offsets, whether
their keys were stored (ingested, then the rows went missing: an accounting question)
or not (never written), and the group's batches just before and just after it on that
partition: who wrote them, their ranges, when. A batch after a run of never-written
winners whose range starts past them, with the batch before ending where the run
starts, is a skip: that batch committed past records nobody wrote.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from ackline.load.verify import FATE, Expected, LossWindow

SHOWN = 5
"""At most this many runs are described (the largest first)."""

_LOST = (
    FATE
    + """
SELECT src_partition, src_offset, batch_id IS NOT NULL AS key_stored FROM c
WHERE NOT present AND NOT erased AND NOT dropped
ORDER BY src_partition, src_offset
LIMIT 100001
"""
)
GROUPED = 100_000
"""At most this many lost winners are grouped into runs (the count itself is exact)."""

_BATCHES_ON = """
SELECT b.batch_id, b.worker, b.committed_at, (b.ranges -> $2)::text AS bounds
FROM ingest_batches b
WHERE b.group_id = $1 AND b.ranges ? $2
"""


@dataclass(frozen=True, slots=True)
class LostRun:
    partition: int
    first: int
    last: int
    count: int
    keys_stored: int


@dataclass(frozen=True, slots=True)
class Written:
    """A batch's range on one partition: offsets [first, end)."""

    batch_id: int
    worker: str
    committed_at: datetime
    first: int
    end: int


def lost_runs(
    lost: Iterable[tuple[int, int, bool]], winners_by_partition: Mapping[int, Sequence[int]]
) -> list[LostRun]:
    """Group lost winners ((partition, offset, key stored)) into runs: winners next to
    each other in their partition's winners (``winners_by_partition``: sorted offsets).
    Largest runs first. Pure."""
    by_partition: dict[int, dict[int, bool]] = {}
    for partition, offset, stored in lost:
        by_partition.setdefault(partition, {})[offset] = stored
    runs: list[LostRun] = []
    for partition, gone in by_partition.items():
        current: list[int] = []
        ends = [*winners_by_partition.get(partition, ()), -1]  # -1: closes the last run
        for offset in ends:
            if offset in gone:
                current.append(offset)
                continue
            if current:
                keys = sum(1 for o in current if gone[o])
                runs.append(LostRun(partition, current[0], current[-1], len(current), keys))
                current = []
    runs.sort(key=lambda r: (-r.count, r.partition, r.first))
    return runs


def _around(
    run: LostRun, written: Sequence[Written]
) -> tuple[Written | None, Written | None, list[Written]]:
    """The batches on the run's partition just before it, just after it, and over it."""
    before = max((w for w in written if w.end <= run.first), key=lambda w: w.end, default=None)
    after = min((w for w in written if w.first > run.last), key=lambda w: w.first, default=None)
    across = [w for w in written if w.first <= run.last and w.end > run.first]
    return before, after, across


def window(run: LostRun, written: Sequence[Written]) -> LossWindow:
    """When the run was lost: from the first commit to the last of the batches before it,
    over it and after it ("" on a side with none of them). Pure."""
    before, after, across = _around(run, written)
    times = [w.committed_at for w in (before, *across, after) if w is not None]
    return LossWindow(
        partition=run.partition,
        since=min(times).isoformat() if times else "",
        until=max(times).isoformat() if times else "",
    )


def describe(run: LostRun, written: Sequence[Written]) -> str:
    """One line: the run, and the batches on its partition around it. Pure."""
    before, after, across = _around(run, written)
    line = (
        f"lost on partition {run.partition}: {run.count:,} winners at offsets "
        f"{run.first}..{run.last}, {run.keys_stored:,} of them with their keys stored"
    )
    for label, w in (("before", before), ("after", after)):
        line += f"; {label}: " + ("none" if w is None else _batch(w))
    if across:
        line += "; over it: " + ", ".join(_batch(w) for w in across[:3])
    if before is not None and after is not None and not across and run.keys_stored == 0:
        line += (
            f" (nothing written in [{before.end}, {after.first}): the batch after "
            "committed past records nobody wrote)"
        )
    return line


def _batch(w: Written) -> str:
    return (
        f"batch {w.batch_id} by {w.worker} [{w.first}, {w.end}) at "
        f"{w.committed_at.strftime('%H:%M:%S.%f')[:-3]}"
    )


async def explain_losses(
    conn: asyncpg.Connection, exp: Expected, topic: str, group_id: str
) -> tuple[tuple[str, ...], tuple[LossWindow, ...]]:
    """The lines of :func:`describe` for the largest runs of lost winners, and each
    described run's :func:`window`; read in the verifier's transaction (its temporary
    tables)."""
    rows = await conn.fetch(_LOST)
    cut = len(rows) > GROUPED
    rows = rows[:GROUPED]
    winners: dict[int, list[int]] = {}
    for w in exp.winners.values():
        winners.setdefault(w.partition, []).append(w.offset)
    for offsets in winners.values():
        offsets.sort()
    runs = lost_runs(
        ((int(r["src_partition"]), int(r["src_offset"]), bool(r["key_stored"])) for r in rows),
        winners,
    )
    lines, windows = [], []
    for run in runs[:SHOWN]:
        found = await conn.fetch(_BATCHES_ON, group_id, f"{topic}:{run.partition}")
        written = [
            Written(int(b["batch_id"]), str(b["worker"]), b["committed_at"], *_bounds(b["bounds"]))
            for b in found
        ]
        lines.append(describe(run, written))
        windows.append(window(run, written))
    if len(runs) > SHOWN:
        lines.append(f"... and {len(runs) - SHOWN} smaller runs of lost winners")
    if cut:
        lines.append(
            f"(only the first {GROUPED:,} lost winners, in partition and offset order, "
            "were grouped: the run that reaches that limit may go on)"
        )
    return tuple(lines), tuple(windows)


def _bounds(text: str) -> tuple[int, int]:
    first, end = json.loads(text)
    return int(first), int(end)
