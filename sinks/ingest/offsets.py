"""Offsets and owner epochs in PostgreSQL: claiming partitions and reading them back.

The offset row (group, topic, partition) is the source of truth for where a partition
resumes. Taking a partition bumps its epoch; every batch's transaction starts with a
compare-and-set on that epoch (see :mod:`ackline.sinks.ingest.writer`), so a worker that lost a
partition can no longer advance it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import asyncpg


@dataclass(frozen=True, slots=True)
class Claim:
    topic: str
    partition: int
    next_offset: int | None  # None: nothing committed yet for this group
    epoch: int


_CLAIM = """
INSERT INTO consumer_offsets AS o
    (group_id, topic, partition, next_offset, epoch, owner, claimed_at)
SELECT $1, u.topic, u.partition, u.start, 1, $4, now()
FROM unnest($2::text[], $3::int[], $5::bigint[]) AS u(topic, partition, start)
ON CONFLICT (group_id, topic, partition) DO UPDATE
    SET epoch = o.epoch + 1, owner = EXCLUDED.owner, claimed_at = now(),
        next_offset = COALESCE(o.next_offset, EXCLUDED.next_offset)
RETURNING o.topic, o.partition, o.next_offset, o.epoch
"""


async def claim(
    conn: asyncpg.Connection,
    group_id: str,
    owner: str,
    partitions: list[tuple[str, int]],
    starts: Mapping[tuple[str, int], int] | None = None,
) -> list[Claim]:
    """Take ``partitions`` for ``owner``: bump each epoch and return where to resume.

    ``starts``: where a partition that has no offset stored yet starts (the log start,
    or the log end for start_from=latest). It is stored by the claim, so it is decided
    once: a worker that claims later resumes there, not at a later log end (which would
    skip what was produced in between). Partitions missing from it keep no offset (they
    are read from the log start).

    Order of effects: one autocommitted statement that inserts missing offset rows and
    increments the epoch of existing ones (storing the start where no offset is stored,
    and waiting for the row lock of any batch still in flight under the previous epoch,
    so that batch commits or rolls back first), then returns next_offset and the new
    epoch. A crash before the statement commits changes
    nothing; a crash after it (before the consumer assigns) leaves a higher epoch that no
    one holds, which the next claim simply bumps again: nothing can be written under it.
    """
    given = starts or {}
    rows = await conn.fetch(
        _CLAIM,
        group_id,
        [t for t, _ in partitions],
        [p for _, p in partitions],
        owner,
        [given.get(tp) for tp in partitions],
    )
    return [
        Claim(str(r["topic"]), int(r["partition"]), r["next_offset"], int(r["epoch"])) for r in rows
    ]


async def read_offsets(conn: asyncpg.Connection, group_id: str) -> list[asyncpg.Record]:
    """Every offset row of ``group_id``, for status and verification."""
    return await conn.fetch(
        "SELECT topic, partition, next_offset, epoch, owner, claimed_at, updated_at "
        "FROM consumer_offsets WHERE group_id = $1 ORDER BY topic, partition",
        group_id,
    )


_LOCKED = """
SELECT o.topic, o.partition, o.next_offset, o.epoch
FROM consumer_offsets AS o
JOIN unnest($2::text[], $3::int[]) AS u(topic, partition)
  ON o.topic = u.topic AND o.partition = u.partition
WHERE o.group_id = $1
FOR SHARE OF o
"""


async def locked_offsets(
    conn: asyncpg.Connection, group_id: str, partitions: list[tuple[str, int]]
) -> list[Claim]:
    """Where ``partitions`` resume and under which epoch, without claiming them.

    The rows are locked FOR SHARE, which waits for any transaction still holding them (a
    batch being rolled back or committed) to end, so the answer is that batch's outcome.
    Reads only; the lock ends with the statement.
    """
    rows = await conn.fetch(
        _LOCKED, group_id, [t for t, _ in partitions], [p for _, p in partitions]
    )
    return [
        Claim(str(r["topic"]), int(r["partition"]), r["next_offset"], int(r["epoch"])) for r in rows
    ]
