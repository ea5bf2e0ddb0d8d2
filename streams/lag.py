"""Lag, and partitions assigned but not consumed, as the consumer runtime reports them.

Two gauges come from here: ``ackline_partition_lag`` per owned partition and
``ackline_partitions_not_consumed``, the partitions Kafka assigns to this worker that it
does not consume (fenced and not taken back, or held back because their DB offset is past
the log end). The second is what the "nobody consumes" alert and ``/readyz`` read: an
assigned partition that silently stops is the stall this gauge exists for.
"""

from __future__ import annotations

import time
from collections.abc import Collection

from ackline.core.metrics import Metrics
from ackline.sinks.ingest.batch import TP

INTERVAL_S = 5.0


def partition_lag(high: int, db_next: int | None, position: int | None, pending: bool) -> int:
    """Records of a partition not yet committed in PostgreSQL. Pure.

    With nothing of the partition buffered or in flight, everything below the consumer's
    position is committed or was skipped (transaction markers, aborted records), so lag
    counts from the position; otherwise from the DB next offset.
    """
    done = db_next or 0
    if not pending and position is not None:
        done = max(done, position)
    return max(high - done, 0)


class PartitionWatch:
    """Sets the two gauges at most every :data:`INTERVAL_S` (reading watermarks costs)."""

    def __init__(self, metrics: Metrics, interval_s: float = INTERVAL_S) -> None:
        self._metrics = metrics
        self._interval_s = interval_s
        self._last = 0.0
        self._labels: set[TP] = set()

    def due(self) -> bool:
        now = time.monotonic()
        if now - self._last < self._interval_s:
            return False
        self._last = now
        return True

    def lag(self, tp: TP, lag: int) -> None:
        self._metrics.lag.labels(tp[0], str(tp[1])).set(lag)
        self._labels.add(tp)

    def not_consumed(self, assigned: Collection[TP], consumed: Collection[TP]) -> int:
        """Set and return the count of assigned partitions this worker does not consume
        (``consumed``: the ledger's owned partitions, neither suspended nor blocked)."""
        stuck = {tp for tp in assigned if tp not in consumed}
        self._metrics.not_consumed.set(len(stuck))
        return len(stuck)

    def forget(self, tps: Collection[TP]) -> None:
        """Partitions given up (revoked or lost): their lag is another worker's now."""
        for tp in tps:
            if tp in self._labels:
                self._labels.discard(tp)
                self._metrics.lag.remove(tp[0], str(tp[1]))
