"""The chaos producer's pace: a steady rate, parked on the harness's request.

The harness parks production around faults that must not straddle a transaction (a broker
restart) or that take long (a zombie's partitions moving to the others). Faults are
planned by ingest progress, so production must outlast the schedule: time spent parked
therefore shifts the schedule instead of being made up by a burst, which would end
production as early as without the pause and leave the faults planned after it no work
(a short chaos run once made no COMMIT fault at all). Past its plan, while the harness
holds production open (:mod:`ackline.load.chaos.topup`), production trickles at
:data:`TOP_UP_RATE`, counted from the plan's end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

PARK_POLL_S = 0.1
TOP_UP_RATE = 500.0
"""Originals per second past the plan: enough to keep every worker's batches coming (a
COMMIT to cut, a batch to hold), little enough that a long hold, even of an unthrottled
run, adds no backlog to speak of."""


class Pacer:
    """Called between two of the producer's transactions with the records sent so far."""

    def __init__(
        self,
        rate: float,
        pause: Path,
        paused: Path,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        planned: int | None = None,
    ) -> None:
        """``rate``: records per second (0: unthrottled). While ``pause`` exists the
        producer parks and says so with ``paused``. Once ``planned`` originals are sent,
        the rest is a top-up: at :data:`TOP_UP_RATE` from then on, whatever ``rate``."""
        self._rate = rate
        self._pause = pause
        self._paused = paused
        self._clock = clock
        self._sleep = sleep
        self._started = clock()
        self._planned = planned
        self._base = 0  # originals sent when the current rate took over

    def __call__(self, sent: int) -> None:
        if self._rate > 0:
            ahead = (sent - self._base) / self._rate - (self._clock() - self._started)
            if ahead > 0:
                self._sleep(ahead)
        if self._planned is not None and sent >= self._planned:
            self._planned = None  # the plan is sent: a top-up, if any, trickles from now
            self._rate, self._base, self._started = TOP_UP_RATE, sent, self._clock()
        if not self._pause.exists():
            return
        self._paused.touch()
        parked = self._clock()
        while self._pause.exists():
            self._sleep(PARK_POLL_S)
        self._started += self._clock() - parked
        self._paused.unlink()
