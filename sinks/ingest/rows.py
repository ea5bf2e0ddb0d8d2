"""The column lists and record tuples of the two tables a new event is COPYed into.

Pure mapping, shared by the writer and by the bench's COPY limit (which must write the very
same rows to be a fair ceiling).
"""

from __future__ import annotations

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
)


def ledger_record(
    row: Row, topic: str, partition: int, offset: int, batch_id: int
) -> tuple[Any, ...]:
    """The ``txn_ledger`` record of ``row``, in LEDGER_COLUMNS order."""
    return (row.txn_id, row.event_id, row.body_hash, topic, partition, offset, batch_id)


def activity_record(
    row: Row, topic: str, partition: int, offset: int, batch_id: int
) -> tuple[Any, ...]:
    """The ``activity`` record of ``row``, in ACTIVITY_COLUMNS order."""
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
    )
