"""`ackline status`: per partition, where PostgreSQL and Kafka say the group is.

The DB next offset is the truth (where the partition resumes); Kafka's committed offset
is advisory and may trail it by the auto-commit interval. ``lag`` is the one lag of
:mod:`ackline.streams.lag`, as the worker's ``ackline_partition_lag``, ``/readyz`` and
``ackline doctor`` count it: the last stable offset (``high``: the end a read_committed
consumer reads to; a transaction still open upstream is past it, not lag) minus the DB
next offset (the log start when nothing is committed yet), and 0 when everything in
between is transaction markers or aborted records — which no consumer is ever given
(the caller finds those partitions by reading,
:func:`ackline.streams.kafkainfo.scan_ranges`). With committed records in between it
counts the markers among them too, as /metrics does.

``owner`` is the worker id that last claimed the partition in PostgreSQL; it is *live*
when a member of the consumer group has that client id (ackline sets ``client.id`` to
the worker id in both runtimes). ``assigned`` is the member Kafka assigned the
partition to now; an owner that is not live, or an assignment nobody consumes, is
how a dead or stuck worker shows.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import asyncpg

from ackline.render import table
from ackline.sinks.ingest.offsets import read_offsets
from ackline.streams.kafkainfo import GroupMember, PartitionOffsets


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
    owner_live: bool | None = None
    """Whether ``owner`` is a member of the group now (None: no owner, or not known)."""
    assigned: str | None = None
    """The client id of the group member Kafka assigned this partition to now."""

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


def unread_starts(
    db: Sequence[OffsetRow], kafka: Sequence[PartitionOffsets]
) -> tuple[dict[int, int], dict[int, int]]:
    """(starts, ends) of the ranges between each partition's resume point and its last
    stable offset, for the partitions where that range is not empty. Pure."""
    by_db = {r.partition: r for r in db}
    starts: dict[int, int] = {}
    ends: dict[int, int] = {}
    for log in kafka:
        row = by_db.get(log.partition)
        done = row.next_offset if row is not None and row.next_offset is not None else log.low
        start = max(done, log.low)
        if log.high > start:
            starts[log.partition] = start
            ends[log.partition] = log.high
    return starts, ends


def merge(
    db: Sequence[OffsetRow],
    kafka: Sequence[PartitionOffsets],
    *,
    settled: Collection[int] = (),
    members: Sequence[GroupMember] | None = None,
    topic: str | None = None,
) -> list[PartitionStatus]:
    """One status per partition known to either side, in partition order. Pure.

    ``settled``: partitions whose unread range holds no committed record (lag 0).
    ``members``: the group's live members (None: not known, liveness left unset); their
    assignments count for ``topic`` only (None: every topic).
    """
    by_db = {r.partition: r for r in db}
    by_kafka = {k.partition: k for k in kafka}
    live = None if members is None else {m.client_id for m in members}
    assignee = {
        p: m.client_id for m in members or () for t, p in m.partitions if topic in (None, t)
    }
    out = []
    for p in sorted(by_db.keys() | by_kafka.keys()):
        row, log = by_db.get(p), by_kafka.get(p)
        db_next = row.next_offset if row else None
        lag = None
        if log is not None:
            done = db_next if db_next is not None else log.low
            lag = 0 if p in settled else max(log.high - done, 0)
        owner = row.owner if row else None
        out.append(
            PartitionStatus(
                partition=p,
                db_next=db_next,
                kafka_committed=log.committed if log else None,
                low=log.low if log else None,
                high=log.high if log else None,
                lag=lag,
                epoch=row.epoch if row else None,
                owner=owner,
                updated_at=row.updated_at if row else None,
                owner_live=None if live is None or owner is None else owner in live,
                assigned=assignee.get(p),
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


GROUPS_SHOWN = 5


async def groups_with_offsets(conn: asyncpg.Connection, topic: str) -> list[str]:
    """The groups with an offset row for ``topic``, in name order, at most
    ``GROUPS_SHOWN + 1`` (one more than shown tells there are more)."""
    rows = await conn.fetch(
        "SELECT DISTINCT group_id FROM consumer_offsets WHERE topic = $1 ORDER BY group_id "
        "LIMIT $2",
        topic,
        GROUPS_SHOWN + 1,
    )
    return [str(r["group_id"]) for r in rows]


def no_offsets_note(
    db: Sequence[OffsetRow], group_id: str, topic: str, groups: Sequence[str]
) -> str | None:
    """A line when PostgreSQL holds no offset of ``group_id`` for ``topic``, else None. Pure.

    A mistyped or never-used group id otherwise looks like a healthy group that has not
    started yet (every DB offset ``-``, lag counted from the log start); ``groups`` (from
    :func:`groups_with_offsets`) names the ones that do have offsets, to spot the typo.
    """
    if db:
        return None
    shown = [g for g in groups if g != group_id][:GROUPS_SHOWN]
    more = ", ..." if len(groups) > GROUPS_SHOWN else ""
    others = (
        f"groups with offsets for it: {', '.join(shown)}{more}"
        if shown
        else "no group has offsets for it"
    )
    return (
        f"no DB offsets for group {group_id} on topic {topic}: never ingested by this group, "
        f"or a mistyped group id (--group-id / ACKLINE_GROUP_ID); {others}"
    )


def _owner(r: PartitionStatus) -> str | None:
    if r.owner is None or r.owner_live is None:
        return r.owner
    return r.owner if r.owner_live else f"{r.owner} (not in group)"


def render(
    topic: str, group_id: str, rows: Sequence[PartitionStatus], note: str | None = None
) -> str:
    headers = (
        "partition", "db next", "kafka committed", "high", "lag", "epoch", "owner", "assigned",
    )  # fmt: skip
    body = [
        (r.partition, r.db_next, r.kafka_committed, r.high, r.lag, r.epoch, _owner(r), r.assigned)
        for r in rows
    ]
    total = sum(r.lag or 0 for r in rows)
    lines = [f"topic {topic}, group {group_id}, total lag {total}", table(headers, body)]
    dead = sorted({r.owner for r in rows if r.owner and r.owner_live is False})
    if dead:
        lines.append(
            f"not in the group now: {', '.join(dead)} (a stopped or crashed worker; its "
            "partitions move to a live member at the next rebalance)"
        )
    if any(r.assigned is not None for r in rows):
        idle = [r.partition for r in rows if r.assigned is None]
        if idle:
            lines.append(f"assigned to no member now: partitions {idle}")
    if note is not None:
        lines.append(note)
    return "\n".join(lines)


def to_json(
    topic: str,
    group_id: str,
    rows: Sequence[PartitionStatus],
    topic_id: str | None = None,
    recorded_topic_id: str | None = None,
) -> dict[str, Any]:
    """``topic_id``: Kafka's ID of the topic now; ``recorded_topic_id``: the one the
    group's DB offsets belong to (they differ: the topic was made again, see the note)."""
    return {
        "topic": topic,
        "group_id": group_id,
        "topic_id": topic_id,
        "recorded_topic_id": recorded_topic_id,
        "total_lag": sum(r.lag or 0 for r in rows),
        "partitions": [r.to_json() for r in rows],
    }
