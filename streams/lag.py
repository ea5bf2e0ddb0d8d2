"""What the default runtime reports of its partitions: lag, partitions assigned but not
consumed, offsets lost to retention; and the watermark reads behind them.

Lag, in every report of it (``ackline_partition_lag``, ``/readyz``, ``ackline status``,
``ackline doctor``, both runtimes), is what a read_committed reader can read and
PostgreSQL has not committed: the last stable offset (LSO) minus the DB next offset,
offsets known to hold no record (transaction markers, aborted records) left out. Not the
high watermark: the records of a transaction still open upstream lie between the LSO and
the high watermark, no read_committed consumer is given them until it commits, and a
transaction may stay open for ``transaction.max.timeout.ms`` (15 minutes by default); a
worker is not behind on them. The default runtime takes the LSO from librdkafka's
statistics (:func:`stable_offsets`, every ``statistics.interval.ms``), which cost no
request on the consumer thread.

Two gauges come from here: ``ackline_partition_lag`` per owned partition and
``ackline_partitions_not_consumed``, the partitions Kafka assigns to this worker that it
does not consume (suspended after a batch that did not commit or a fence, and not
claimed again yet, or held back because their DB offset is past the log end). The second
is what the "nobody consumes" alert and ``/readyz`` read: an assigned partition that
silently stops is the stall this gauge exists for.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from ackline.core.metrics import Metrics
from ackline.sinks.ingest.batch import TP

log = logging.getLogger(__name__)

INTERVAL_S = 5.0


def partition_lag(stable: int, db_next: int | None, position: int | None, pending: bool) -> int:
    """Records of a partition a read_committed reader can read (below ``stable``, the
    last stable offset) and PostgreSQL has not committed. Pure.

    With nothing of the partition buffered or in flight, everything below the consumer's
    position is committed or was skipped (transaction markers, aborted records), so lag
    counts from the position; otherwise from the DB next offset.
    """
    done = db_next or 0
    if not pending and position is not None:
        done = max(done, position)
    return max(stable - done, 0)


def stable_offsets(stats: Mapping[str, Any]) -> dict[TP, int]:
    """Each partition's last stable offset from one librdkafka statistics JSON (parsed):
    ``topics.<topic>.partitions.<n>.ls_offset``. Pure.

    librdkafka sets it from every fetch response (the broker's LSO under read_committed,
    the high watermark under read_uncommitted or from a broker too old to send one);
    partitions it has not fetched yet (-1001), and its internal unassigned partition
    (-1), are left out: no value is better than a wrong one.
    """
    found: dict[TP, int] = {}
    topics = stats.get("topics")
    if not isinstance(topics, Mapping):
        return found
    for topic, facts in topics.items():
        parts = facts.get("partitions") if isinstance(facts, Mapping) else None
        if not isinstance(parts, Mapping):
            continue
        for part in parts.values():
            if not isinstance(part, Mapping):
                continue
            partition, stable = part.get("partition"), part.get("ls_offset")
            if (
                isinstance(partition, int)
                and isinstance(stable, int)
                and min(partition, stable) >= 0
            ):
                found[(str(topic), partition)] = stable
    return found


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


def watermarks(consumer: Consumer, tps: list[TP], timeout_s: float) -> dict[TP, tuple[int, int]]:
    """(log start, log end) of ``tps`` within ``timeout_s`` in all; the partitions that did
    not answer in time are left out."""
    found: dict[TP, tuple[int, int]] = {}
    deadline = time.monotonic() + timeout_s
    for tp in tps:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            found[tp] = consumer.get_watermark_offsets(TopicPartition(*tp), timeout=left)
        except KafkaException as exc:
            log.warning("cannot read the watermarks of %s[%d]: %s", tp[0], tp[1], exc)
    return found


def log_start(consumer: Consumer, tp: TP) -> int | None:
    """``tp``'s log start offset: librdkafka's cached one (fetch responses carry it), else
    asked of the broker; None (logged) when it cannot be read."""
    part = TopicPartition(tp[0], tp[1])
    try:
        low, _ = consumer.get_watermark_offsets(part, cached=True)
        if low < 0:
            low, _ = consumer.get_watermark_offsets(part, timeout=5)
    except KafkaException as exc:
        log.info("cannot read the log start of %s[%d]: %s", tp[0], tp[1], exc)
        return None
    return int(low)


def count_retention_gap(
    consumer: Consumer | None, metrics: Metrics, tp: TP, expected: int, offset: int
) -> int:
    """Count and report the offsets retention deleted before this group read them, the
    first record after ``expected`` (the DB offset) being at ``offset``.

    A jump in a partition's offsets is usual (transaction markers, aborted records); one
    that starts below the log start offset means retention deleted records this group
    never read. The fence allows the jump, the DB offset moves past the gap with the next
    batch; nothing can bring those records back. Returns how many were skipped.
    """
    if consumer is None:
        return 0
    low = log_start(consumer, tp)
    if low is None:
        return 0
    return retention_gap(metrics, tp, expected, min(low, offset), offset)


def retention_gap(metrics: Metrics, tp: TP, expected: int, low: int, at: int) -> int:
    """Count and log the offsets ``expected``..``low - 1`` as deleted by retention before
    this group ingested them (none when ``low`` is not past ``expected``), the read going
    on at ``at``: the default runtime at the first record past a gap, the faust runtime
    at a claim whose DB offset is below the log start. Returns how many."""
    if low <= expected:
        return 0
    skipped = low - expected
    metrics.retention_skipped.labels(tp[0], str(tp[1])).inc(skipped)
    log.error(
        "%s[%d]: offsets %d..%d were deleted by retention before this group ingested "
        "them (%d offsets skipped); continuing at %d",
        tp[0],
        tp[1],
        expected,
        low - 1,
        skipped,
        at,
    )
    return skipped
