"""The step both runtimes take after PostgreSQL committed a batch: store, count, log.

Every "ingested" figure comes from here, so it is counted after the COMMIT and never on
fetch. The advisory Kafka offsets are each runtime's own (the default runtime stores them
for auto-commit; the faust runtime commits the ledger's DB offsets on faust's timer).
"""

from __future__ import annotations

import logging
from typing import Any

from ackline.core.logs import BATCH_LOGGER
from ackline.core.metrics import Metrics
from ackline.sinks.ingest.batch import Batch
from ackline.sinks.ingest.writer import WriteResult
from ackline.streams.ownership import Ledger

_batches = logging.getLogger(BATCH_LOGGER)


def record_committed(
    ledger: Ledger, metrics: Metrics, batch: Batch, result: WriteResult, seconds: float
) -> None:
    """After PostgreSQL committed ``batch``: the ledger's DB offsets advance (for the
    partitions still owned under the batch's epoch), then it is counted and logged.
    In memory only: a crash here leaves the DB offsets, which decide where work resumes."""
    ledger.committed(batch.ranges)
    count_committed(metrics, result, seconds)
    log_committed(batch, result, seconds)


def log_committed(batch: Batch, result: WriteResult, seconds: float) -> None:
    """One INFO line for a batch PostgreSQL has committed (cheap when disabled)."""
    if _batches.isEnabledFor(logging.INFO):
        _batches.info(
            "batch %d committed: %s",
            result.batch_id,
            batch.describe(),
            extra=batch_fields(batch, result, seconds),
        )


def count_committed(metrics: Metrics, result: WriteResult, seconds: float) -> None:
    """The metrics of one committed batch."""
    metrics.batches.inc()
    metrics.ingested.inc(result.inserted)
    for layer, n in result.duplicates.items():
        metrics.duplicates.labels(layer).inc(n)
    metrics.exact_copies.inc(result.exact)
    for layer, n in result.conflicts.items():
        metrics.conflicts.labels(layer).inc(n)
    for reason, n in result.rejects.items():
        metrics.rejects.labels(reason).inc(n)
    metrics.batch_size.observe(result.events)
    metrics.batch_seconds.observe(seconds)
    metrics.last_commit.set_to_current_time()


def batch_fields(batch: Batch, result: WriteResult, seconds: float) -> dict[str, Any]:
    """The structured fields of one committed batch's log line. Pure."""
    return {
        "event": "batch_committed",
        "batch_id": result.batch_id,
        "ranges": [
            {
                "topic": r.topic,
                "partition": r.partition,
                "first_offset": r.first_offset,
                "next_offset": r.next_offset,
                "epoch": r.epoch,
            }
            for r in batch.ranges
        ],
        "events": result.events,
        "inserted": result.inserted,
        "duplicates": dict(result.duplicates),
        "exact": result.exact,
        "conflicts": dict(result.conflicts),
        "rejects": dict(result.rejects),
        "seconds": round(seconds, 4),
    }
