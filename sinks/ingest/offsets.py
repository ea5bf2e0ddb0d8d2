"""Offsets and owner epochs in PostgreSQL: claiming partitions and reading them back.

The offset row (group, topic, partition) is the source of truth for where a partition
resumes. Taking a partition bumps its epoch; every batch's transaction starts with a
compare-and-set on that epoch (see :mod:`ackline.sinks.ingest.writer`), so a worker that lost a
partition can no longer advance it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import asyncpg

log = logging.getLogger(__name__)


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
    *,
    stuck_after_s: float | None = None,
) -> list[Claim]:
    """Take ``partitions`` for ``owner``: bump each epoch and return where to resume.

    ``starts``: where a partition that has no offset stored yet starts (the log start,
    or the log end for start_from=latest). It is stored by the claim, so it is decided
    once: a worker that claims later resumes there, not at a later log end (which would
    skip what was produced in between). Partitions missing from it keep no offset (they
    are read from the log start).

    Order of effects: one statement that inserts missing offset rows and increments the
    epoch of existing ones (storing the start where no offset is stored, and waiting for
    the row lock of any batch still in flight under the previous epoch, so that batch
    commits or rolls back first), then returns next_offset and the new epoch. A crash
    before the statement commits changes nothing; a crash after it (before the consumer
    assigns) leaves a higher epoch that no one holds, which the next claim simply bumps
    again: nothing can be written under it.

    ``stuck_after_s`` (the workers' statement bound): the wait for a row lock is cut into
    slices (see :func:`_claim_past_stuck_holders`), so that a previous owner stopped mid-batch,
    whose locks PostgreSQL would never free, is ended instead of waited for for ever.
    """
    given = starts or {}
    topics, numbers = [t for t, _ in partitions], [p for _, p in partitions]
    args = (group_id, topics, numbers, owner, [given.get(tp) for tp in partitions])
    if stuck_after_s is None:
        rows = await conn.fetch(_CLAIM, *args)
    else:
        rows = await _claim_past_stuck_holders(conn, args, stuck_after_s)
    return [
        Claim(str(r["topic"]), int(r["partition"]), r["next_offset"], int(r["epoch"])) for r in rows
    ]


_LOCK_WAIT = "SELECT set_config('lock_timeout', $1, true)"

# The sessions holding an UPDATE's lock on these partitions' offset rows (a batch's
# fence: the row's xmax is its transaction, and it holds RowExclusiveLock on the table)
# that have waited on their client for longer than $4 seconds, terminated. A role may
# terminate its own sessions; other roles' sessions show no backend_xid and never match.
_END_STUCK = """
SELECT s.pid, s.application_name, s.waited_s, pg_terminate_backend(s.pid) AS ended
FROM (
    SELECT DISTINCT a.pid, a.application_name,
           extract(epoch FROM now() - a.state_change)::float8 AS waited_s
    FROM consumer_offsets AS o
    JOIN unnest($2::text[], $3::int[]) AS u(topic, partition)
      ON o.topic = u.topic AND o.partition = u.partition
    JOIN pg_stat_activity AS a ON a.backend_xid = o.xmax
    WHERE o.group_id = $1
      AND a.wait_event = 'ClientRead'
      AND a.state_change < now() - make_interval(secs => $4)
      AND EXISTS (SELECT 1 FROM pg_locks AS l
                  WHERE l.pid = a.pid AND l.granted AND l.mode = 'RowExclusiveLock'
                    AND l.relation = 'consumer_offsets'::regclass)
) AS s
"""


async def _claim_past_stuck_holders(
    conn: asyncpg.Connection, args: tuple[object, ...], stuck_after_s: float
) -> list[asyncpg.Record]:
    """Run the claim statement (its first three arguments: group, topics, partition
    numbers), which waits for the offset rows' locks, past a holder that never lets go.

    A worker stopped (SIGSTOP, a paused VM, a hung process) while its COPY waits for data
    holds its fence's row locks for ever: PostgreSQL does not act on statement_timeout
    while a COPY FROM STDIN reads from its client, the transaction is not idle, and the
    client's kernel keeps the socket alive. A live writer's statements end within its
    statement bound, so a holder that has waited on its client for longer than
    ``stuck_after_s`` is not running.

    Order of effects: in a transaction whose lock_timeout is a third of
    ``stuck_after_s``, the claim; COMMIT. When the lock wait runs out, the statement
    rolled back (nothing changed) and the holders stuck on their client for longer than
    ``stuck_after_s`` are terminated: their transactions roll back, so the batch the
    previous owner had fenced commits nothing and its records are read again from the
    stored offset. Then the claim is tried again. A holder that is working (running a
    statement) is waited for. A crash at any step leaves what the claim alone leaves.
    """
    wait = f"{max(200, int(stuck_after_s * 1000 / 3))}ms"
    said = False
    while True:
        try:
            async with conn.transaction():
                await conn.execute(_LOCK_WAIT, wait)
                return await conn.fetch(_CLAIM, *args)
        except asyncpg.LockNotAvailableError:
            pass
        group, topics, numbers = args[0], args[1], args[2]
        if not said:
            said = True
            log.warning("claim of partitions %s waits for a batch still in flight on them", numbers)
        try:
            ended = await conn.fetch(_END_STUCK, group, topics, numbers, stuck_after_s)
        except asyncpg.InsufficientPrivilegeError as exc:
            log.error("claim: cannot end a session stuck on partitions %s: %s", numbers, exc)
            continue
        for r in ended:
            log.warning(
                "claim: ended session %d (%s), which held the offset rows of partitions %s "
                "while waiting on its client for %.0f s (a previous owner stopped "
                "mid-batch: its transaction rolls back, nothing of it is committed)",
                r["pid"],
                r["application_name"],
                numbers,
                r["waited_s"],
            )


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
