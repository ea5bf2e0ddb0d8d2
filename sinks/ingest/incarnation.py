"""Which incarnation of a topic a group's DB offsets belong to (migration 0015).

A topic deleted and made again under its name starts its offsets at 0, and the group's
DB offsets then point into a log they were never about: once it grew past them, a worker
resumed there and what the new topic held below them was never ingested. Kafka gives
each incarnation its own topic ID; the group's is recorded before a worker first joins,
a worker refuses to start on another (:func:`verdict`), and the operator moves the group
to the new incarnation with :func:`adopt`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import asyncpg

from ackline.sinks.errors import SinkError


@dataclass(frozen=True, slots=True)
class Recorded:
    """What :func:`record` found: the ID recorded for (group, topic), whether this call
    recorded it, and how many offset rows the group holds for the topic."""

    stored: str
    recorded: bool
    offset_rows: int


class Verdict(enum.Enum):
    SAME = "same"  # the offsets belong to this incarnation
    FIRST = "first"  # recorded now: no offsets yet
    UPGRADE = "upgrade"  # recorded now, beside offsets from before migration 0015
    OTHER = "other"  # the offsets belong to another incarnation: refuse


def verdict(current: str, found: Recorded) -> Verdict:
    """What a worker starting on incarnation ``current`` does with ``found``. Pure.

    Offsets without a recorded ID are from before the migration: they are taken for the
    current incarnation (nothing can tell better), as every start did before."""
    if found.stored != current:
        return Verdict.OTHER
    if not found.recorded:
        return Verdict.SAME
    return Verdict.UPGRADE if found.offset_rows else Verdict.FIRST


@dataclass(frozen=True, slots=True)
class Judged:
    """What a check of incarnation ``current`` against what :func:`record` found says:
    the refusal line (another incarnation), else the INFO line worth logging (an ID
    recorded now), else neither."""

    refusal: str | None
    note: str | None


def judge(topic: str, group: str, current: str, found: Recorded) -> Judged:
    """The start's and the running watch's one reading of :func:`verdict`. Pure."""
    seen = verdict(current, found)
    if seen is Verdict.OTHER:
        return Judged(other_incarnation_line(topic, group, found.stored, current), None)
    if seen is Verdict.UPGRADE:
        return Judged(
            None,
            f"recorded topic ID {current} of {topic} for group {group}: its "
            f"{found.offset_rows} DB offsets, from before topic IDs were recorded, are "
            "taken as this incarnation's",
        )
    if seen is Verdict.FIRST:
        return Judged(None, f"recorded topic ID {current} of {topic} for group {group}")
    return Judged(None, None)


@dataclass(frozen=True, slots=True)
class Confirmed:
    """A topic ID a worker's start read (the read began at monotonic ``read_at``) and
    found to be the one its group's DB offsets belong to: the running watch's baseline,
    so that it neither asks PostgreSQL again nor misses a recreation in between."""

    topic_id: str
    read_at: float


def mismatch_line(topic: str, group: str, recorded: str | None, current: str | None) -> str | None:
    """The refusal line when both IDs are known and differ (for what reports, not
    refuses: `status`), else None. Pure."""
    if recorded is None or current is None or recorded == current:
        return None
    return other_incarnation_line(topic, group, recorded, current)


def other_incarnation_line(topic: str, group: str, stored: str, current: str) -> str:
    """The refusal's one line: both IDs, the group, and what to do. Pure."""
    return (
        f"topic {topic} is another incarnation than group {group}'s DB offsets belong to "
        f"(topic ID now {current}, recorded {stored}): the topic was deleted and made "
        "again, and resuming at those offsets would skip the new topic's records below "
        f"them. To ingest the new topic from its log start, stop every worker of the group "
        f"and run `ackline offsets adopt-topic --topic {topic} --group-id {group}`"
    )


_RECORD = "SELECT stored, recorded, offset_rows FROM ackline_record_topic_id($1, $2, $3)"
_RECORDED = "SELECT topic_id FROM topic_incarnations WHERE group_id = $1 AND topic = $2"
_MIGRATED = "SELECT to_regclass('topic_incarnations') IS NOT NULL"


async def migrated(conn: asyncpg.Connection) -> bool:
    """Whether migration 0015's table is there. Read-only."""
    return bool(await conn.fetchval(_MIGRATED))


async def recorded_id(conn: asyncpg.Connection, group: str, topic: str) -> str | None:
    """The topic ID (group, topic)'s DB offsets belong to; None when none is recorded or
    the schema has no topic incarnations (before migration 0015). Read-only."""
    if not await migrated(conn):
        return None
    found = await conn.fetchval(_RECORDED, group, topic)
    return None if found is None else str(found)


async def record(conn: asyncpg.Connection, group: str, topic: str, topic_id: str) -> Recorded:
    """Record ``topic_id`` for (group, topic) where none is, and say what is recorded.

    Order of effects: one autocommitted call of ackline_record_topic_id (0015), which
    inserts the row unless there is one (ON CONFLICT DO NOTHING: two workers starting
    together record one ID), then reads it. A crash before it commits records nothing;
    after, the recorded ID is this incarnation's, which is what the next start records
    anyway. It never replaces a recorded ID."""
    row = await conn.fetchrow(_RECORD, group, topic, topic_id)
    if row is None:  # the function always returns the row it inserted or found
        raise RuntimeError("ackline_record_topic_id returned no row")
    return Recorded(str(row["stored"]), bool(row["recorded"]), int(row["offset_rows"]))


class NothingToAdoptError(SinkError):
    """The group never ingested the topic: adopting would only record an ID for a name
    that may be mistyped (an operator's hunt: it succeeded and said nothing was wrong)."""


@dataclass(frozen=True, slots=True)
class Adopted:
    previous: str | None  # the ID recorded before (None: none was)
    offsets: dict[int, int | None]  # the DB offsets rewound from, partition -> next offset
    started: tuple[int, ...] = ()  # partitions the group had no DB offset for, stored at 0


_LOCK = """
SELECT topic_id FROM topic_incarnations WHERE group_id = $1 AND topic = $2 FOR UPDATE
"""
_REWIND = """
UPDATE consumer_offsets AS o
SET next_offset = 0, epoch = o.epoch + 1, owner = NULL, updated_at = now()
FROM consumer_offsets AS old
WHERE o.group_id = $1 AND o.topic = $2
  AND old.group_id = o.group_id AND old.topic = o.topic AND old.partition = o.partition
RETURNING o.partition, old.next_offset
"""
_HAS_OFFSETS = "SELECT EXISTS (SELECT 1 FROM consumer_offsets WHERE group_id = $1 AND topic = $2)"
_NEW_PARTITIONS = """
INSERT INTO consumer_offsets (group_id, topic, partition, next_offset, epoch, owner, claimed_at)
SELECT $1, $2, p, 0, 1, NULL, now() FROM generate_series(0, $3::int - 1) AS p
ON CONFLICT (group_id, topic, partition) DO NOTHING
RETURNING partition
"""
_ADOPT = """
INSERT INTO topic_incarnations AS t (group_id, topic, topic_id) VALUES ($1, $2, $3)
ON CONFLICT (group_id, topic) DO UPDATE SET topic_id = EXCLUDED.topic_id, recorded_at = now()
"""


async def adopt(
    conn: asyncpg.Connection, group: str, topic: str, topic_id: str, partitions: int = 0
) -> Adopted | None:
    """Make ``topic_id`` the incarnation of (group, topic): rewind the group's DB offsets
    for the topic to 0 with their epochs bumped, and record the ID, in one transaction.
    The next worker resumes each partition at 0 (the new topic's log start; records
    retention already took count as such), whatever ACKLINE_START_FROM says: `latest`
    would skip what the new topic holds. Rewound, not deleted: a claim after a delete
    starts the epoch at 1 again, and a late batch of a worker cut off at epoch 1 would
    pass the fence. Rows already ingested stay; a record of the new topic that carries an
    event already stored is a duplicate as ever. When the group has offset rows for the
    topic, a partition of the new topic's ``partitions`` that has none gets one at 0 (no
    owner, its epoch bumped with the rest): left without one, its first claim started it
    by ACKLINE_START_FROM, and `latest` skipped what the new topic already held there (an
    operator's loss). A group with no rows gets none (it starts as any new group does).

    None, and nothing changed, when ``topic_id`` is the one recorded already;
    NothingToAdoptError, nothing changed, when the group has neither a recorded ID nor an
    offset row for the topic.

    Order of effects, all in one transaction: lock the recorded row (a concurrent adopt
    waits) and read it (the ID already recorded: roll back), insert the missing offset
    rows at 0 (waiting for a claim of one in flight), rewind every row (those just
    inserted too: their epoch moves past any claim's), upsert the ID; COMMIT. A crash
    before COMMIT changes nothing (the workers still refuse); after it, the group starts
    the new incarnation.
    A worker still holding a partition is fenced at its next batch (its epoch moved on)
    and claims it again, at 0 (stop the group's workers first all the same)."""
    async with conn.transaction():
        previous = await conn.fetchval(_LOCK, group, topic)
        if previous == topic_id:
            return None
        ingested = await conn.fetchval(_HAS_OFFSETS, group, topic)
        if previous is None and not ingested:  # rolled back: nothing written
            raise NothingToAdoptError(
                f"group {group} has no DB offsets and no recorded incarnation for topic "
                f"{topic}: nothing to adopt (a mistyped --group-id / ACKLINE_GROUP_ID?)"
            )
        # only a group that ingested the old incarnation: one with no offsets (never
        # started, or a mistyped --group-id) keeps starting by ACKLINE_START_FROM.
        # Inserted before the rewind: a claim of one of them committed meanwhile (a worker
        # still running) is then rewound too; after it, the insert's DO NOTHING kept the
        # claim's start and epoch 1, neither rewound nor fenced
        inserted = await conn.fetch(_NEW_PARTITIONS, group, topic, partitions) if ingested else []
        started = {int(r["partition"]) for r in inserted}
        rewound = await conn.fetch(_REWIND, group, topic)
        await conn.execute(_ADOPT, group, topic, topic_id)
    return Adopted(
        None if previous is None else str(previous),
        {
            int(r["partition"]): r["next_offset"]
            for r in rewound
            if int(r["partition"]) not in started
        },
        tuple(sorted(started)),
    )
