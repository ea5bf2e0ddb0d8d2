"""`ackline status`: per partition, where PostgreSQL and Kafka say the group is.

The DB next offset is the truth (where the partition resumes); Kafka's committed offset
is advisory and may trail it by the auto-commit interval. ``lag`` is the high
watermark minus the DB next offset (minus the log start when nothing is committed
yet); under read_committed it is an upper bound, since transaction markers and
aborted records take offsets too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import asyncpg

from ackline.render import table
from ackline.sinks.ingest.offsets import read_offsets
from ackline.streams.kafkainfo import PartitionOffsets


@dataclass(frozen=True, slots=True)
class PartitionStatus:
    partition: int
    db_next: int | None
    kafka_committed: int | None
    low: int | None
    high: int | None
    lag: int | None
    epoch: int | None
    owner: str | None
    updated_at: datetime | None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["updated_at"] = self.updated_at.isoformat() if self.updated_at else None
        return out


@dataclass(frozen=True, slots=True)
class OffsetRow:
    partition: int
    next_offset: int | None
    epoch: int
    owner: str | None
    updated_at: datetime | None


def merge(db: Sequence[OffsetRow], kafka: Sequence[PartitionOffsets]) -> list[PartitionStatus]:
    """One status per partition known to either side, in partition order. Pure."""
    by_db = {r.partition: r for r in db}
    by_kafka = {k.partition: k for k in kafka}
    out = []
    for p in sorted(by_db.keys() | by_kafka.keys()):
        row, log = by_db.get(p), by_kafka.get(p)
        db_next = row.next_offset if row else None
        lag = None
        if log is not None:
            lag = max(log.high - (db_next if db_next is not None else log.low), 0)
        out.append(
            PartitionStatus(
                partition=p,
                db_next=db_next,
                kafka_committed=log.committed if log else None,
                low=log.low if log else None,
                high=log.high if log else None,
                lag=lag,
                epoch=row.epoch if row else None,
                owner=row.owner if row else None,
                updated_at=row.updated_at if row else None,
            )
        )
    return out


async def db_offsets(conn: asyncpg.Connection, group_id: str, topic: str) -> list[OffsetRow]:
    return [
        OffsetRow(
            partition=int(r["partition"]),
            next_offset=None if r["next_offset"] is None else int(r["next_offset"]),
            epoch=int(r["epoch"]),
            owner=r["owner"],
            updated_at=r["updated_at"],
        )
        for r in await read_offsets(conn, group_id)
        if r["topic"] == topic
    ]


def render(topic: str, group_id: str, rows: Sequence[PartitionStatus]) -> str:
    headers = ("partition", "db next", "kafka committed", "high", "lag", "epoch", "owner")
    body = [
        (r.partition, r.db_next, r.kafka_committed, r.high, r.lag, r.epoch, r.owner) for r in rows
    ]
    total = sum(r.lag or 0 for r in rows)
    return f"topic {topic}, group {group_id}, total lag {total}\n" + table(headers, body)


def to_json(topic: str, group_id: str, rows: Sequence[PartitionStatus]) -> dict[str, Any]:
    return {
        "topic": topic,
        "group_id": group_id,
        "total_lag": sum(r.lag or 0 for r in rows),
        "partitions": [r.to_json() for r in rows],
    }
