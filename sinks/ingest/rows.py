"""The column lists and record tuples of the three tables a new event is COPYed into.

Pure mapping, shared by the writer and by the bench's COPY limit (which must write the very
same rows to be a fair ceiling): ``txn_ledger`` (layer 1 of dedup), ``event_keys`` (layer
2) and ``activity`` (partitioned by ``ingested_on``, the UTC day of the batch's
transaction). Before migration 0008 there is no ``event_keys`` and ``activity`` has no
``ingested_on`` to write (:data:`UNPARTITIONED_ACTIVITY_COLUMNS`).
"""

from __future__ import annotations

from datetime import date
from typing import Any, Final

from ackline.schemas.decode import Row

LEDGER_COLUMNS: Final = (
    "txn_id",
    "event_id",
    "body_hash",
    "src_topic",
    "src_partition",
    "src_offset",
    "batch_id",
)

EVENT_KEY_COLUMNS: Final = ("event_id", "body_hash", "batch_id")

ACTIVITY_COLUMNS: Final = (
    "event_id",
    "txn_id",
    "type",
    "agent_id",
    "request_id",
    "occurred_at",
    "schema_version",
    "payload",
    "body_hash",
    "src_topic",
    "src_partition",
    "src_offset",
    "batch_id",
    "ingested_on",
)

UNPARTITIONED_ACTIVITY_COLUMNS: Final = ACTIVITY_COLUMNS[:-1]
"""The columns of ``activity`` before migration 0008 (ingested_on is then a default)."""


def ledger_record(
    row: Row, topic: str, partition: int, offset: int, batch_id: int
) -> tuple[Any, ...]:
    """The ``txn_ledger`` record of ``row``, in LEDGER_COLUMNS order."""
    return (row.txn_id, row.event_id, row.body_hash, topic, partition, offset, batch_id)


def event_key_record(row: Row, batch_id: int) -> tuple[Any, ...]:
    """The ``event_keys`` record of ``row``, in EVENT_KEY_COLUMNS order."""
    return (row.event_id, row.body_hash, batch_id)


def activity_record(
    row: Row, topic: str, partition: int, offset: int, batch_id: int, ingested_on: date
) -> tuple[Any, ...]:
    """The ``activity`` record of ``row``, in ACTIVITY_COLUMNS order (drop the last field
    for UNPARTITIONED_ACTIVITY_COLUMNS)."""
    return (
        row.event_id,
        row.txn_id,
        row.type,
        row.agent_id,
        row.request_id,
        row.occurred_at,
        row.schema_version,
        row.payload_json,
        row.body_hash,
        topic,
        partition,
        offset,
        batch_id,
        ingested_on,
    )
