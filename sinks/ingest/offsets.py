"""Offsets and owner epochs in PostgreSQL: claiming partitions and reading them back.

The offset row (group, topic, partition) is the source of truth for where a partition
resumes. Taking a partition bumps its epoch; every batch's transaction starts with a
compare-and-set on that epoch (see :mod:`ackline.sinks.ingest.writer`), so a worker that lost a
partition can no longer advance it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from ackline.core.tasks import take_outcome
from ackline.sinks.connection import Database, describe

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
    watch: StuckWatch | None = None,
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
    epoch. A crash before the statement commits changes nothing; a crash after it
    (before the consumer assigns) leaves a higher epoch that no one holds, which the next
    claim simply bumps again: nothing can be written under it.

    ``watch``: while the statement waits, a second connection looks at what it waits for
    and ends a previous owner stuck on its client (:func:`_claim_watched`), which
    PostgreSQL would never end.
    """
    given = starts or {}
    numbers = [p for _, p in partitions]
    topics = [t for t, _ in partitions]
    args = (group_id, topics, numbers, owner, [given.get(tp) for tp in partitions])
    if watch is None:
        rows = await conn.fetch(_CLAIM, *args)
    else:
        rows = await _claim_watched(conn, args, watch, numbers)
    return [
        Claim(str(r["topic"]), int(r["partition"]), r["next_offset"], int(r["epoch"])) for r in rows
    ]


@dataclass(frozen=True)
class StuckWatch:
    """How a claim looks past a previous owner that will never let its rows go."""

    connect: Callable[[], Awaitable[asyncpg.Connection]]
    """Opens a second connection (the claim's own is busy waiting); terminated after use."""
    stuck_after_s: float
    """A blocker that has waited on its client within one statement for longer than
    this is stuck: the workers' statement bound. By then a live writer has given that
    statement up (asyncpg sends a cancel at the bound, and drops the connection when the
    cancel goes unanswered), so ending it costs nothing a live writer would have kept."""
    every_s: float = 1.0
    """How often the waiting claim is looked at (from its first second on)."""


async def claim_over(
    db: Database,
    group_id: str,
    owner: str,
    partitions: list[tuple[str, int]],
    starts: Mapping[tuple[str, int], int] | None = None,
) -> list[Claim]:
    """A worker's :func:`claim` over ``db``, retried through outages (both runtimes), and
    watched: a second connection like ``db``'s looks at what it waits for, and a holder
    stuck past ``db``'s statement bound is ended (within the first claim attempt, which
    the same bound cuts)."""
    watch = StuckWatch(db.connect_aside, db.bounds.statement_s)
    return await db.retrying(
        "claim", lambda conn: claim(conn, group_id, owner, partitions, starts, watch=watch)
    )


@dataclass(frozen=True, slots=True)
class Blocker:
    """A session the claim waits for (pg_stat_activity; fields another role's session
    hides without pg_read_all_stats are None)."""

    pid: int
    backend_start: datetime | None
    user: str | None
    application_name: str | None
    state: str | None
    wait_event: str | None
    state_change: datetime | None
    waited_s: float | None


CLIENT_WAITS = frozenset({"ClientRead", "ClientWrite"})


def is_stuck(blocker: Blocker, stuck_after_s: float) -> bool:
    """A blocker running one statement that has waited on its client (for a COPY's data,
    or to take a result) for longer than ``stuck_after_s``.

    PostgreSQL ends neither: it does not act on statement_timeout while it reads from or
    writes to its client, the transaction is not idle (an idle one is ended by
    idle_in_transaction_session_timeout, so it is left to the server), and a stopped
    client's kernel keeps the socket alive."""
    return (
        blocker.state == "active"
        and blocker.wait_event in CLIENT_WAITS
        and blocker.waited_s is not None
        and blocker.waited_s > stuck_after_s
    )


_VISIBLE = "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)"

_BLOCKERS = """
SELECT a.pid, a.backend_start, a.usename, a.application_name, a.state, a.wait_event,
       a.state_change, extract(epoch FROM now() - a.state_change)::float8 AS waited_s
FROM unnest(pg_blocking_pids($1)) AS b(pid)
JOIN pg_stat_activity AS a ON a.pid = b.pid
"""

# Ends the session only if it is still the same one, in the same statement, still waiting
# on its client: a pid can be reused, and a holder that resumed may be committing.
_END_BLOCKER = """
SELECT pg_terminate_backend(a.pid) AS ended
FROM pg_stat_activity AS a
WHERE a.pid = $1 AND a.backend_start = $2 AND a.state_change = $3
  AND a.state = 'active' AND a.wait_event IN ('ClientRead', 'ClientWrite')
"""


_SAY_ENDED_S = 5.0
"""How long a claim that returned waits for its look's answer to a session it ended."""


async def _claim_watched(
    conn: asyncpg.Connection, args: tuple[object, ...], watch: StuckWatch, numbers: list[int]
) -> list[asyncpg.Record]:
    """The claim statement, watched while it waits.

    A worker stopped (SIGSTOP, a paused VM, a hung process) while its COPY waits for data
    holds its fence's row locks for ever (:func:`is_stuck`), and the claim would wait for
    them for ever. So while the claim has not returned, every ``every_s`` a look (a task
    of its own, on a second connection) reads what the claim waits for
    (``pg_blocking_pids``) and terminates the sessions stuck on their client.

    Order of effects: the claim statement is sent; each look reads the blockers, then
    terminates each stuck one if it is still the same session in the same statement; its
    transaction rolls back, so the batch the previous owner had fenced commits nothing
    and its records are read again from the stored offset; the claim, no longer blocked,
    commits. A crash at any step leaves what the claim alone leaves. Any other blocker is
    waited for, up to the claim's own statement bound (then the caller retries, and says
    so). A holder's end frees the claim at once, often before the look has its answer:
    the claim's return then waits up to ``_SAY_ENDED_S`` for the look to say it ended a
    session (cancelled, that line was lost). Only ``asyncio.wait`` is awaited here, so a
    cancellation is never lost: it cancels the claim and the look at once.
    """
    claiming = asyncio.ensure_future(conn.fetch(_CLAIM, *args))
    claiming.add_done_callback(take_outcome)
    eye = _Eye(watch, conn.get_server_pid(), numbers)
    look: asyncio.Future[None] | None = None
    try:
        while True:
            done, _ = await asyncio.wait((claiming,), timeout=eye.next_look_in())
            if done:
                return claiming.result()
            look = asyncio.ensure_future(eye.look())
            look.add_done_callback(take_outcome)
            await asyncio.wait((claiming, look), return_when=asyncio.FIRST_COMPLETED)
            if claiming.done():
                if eye.ending:  # the look's end of a holder let the claim through
                    await asyncio.wait((look,), timeout=_SAY_ENDED_S)
                return claiming.result()
    finally:
        claiming.cancel()
        if look is not None:
            look.cancel()
        eye.close()


class _Eye:
    """The looks of one watched claim attempt, and their second connection."""

    def __init__(self, watch: StuckWatch, pid: int, numbers: list[int]) -> None:
        self._watch = watch
        self._pid = pid
        self._numbers = numbers
        self._side: asyncpg.Connection | None = None
        self._closed = False
        self._failures = 0
        self._visible: bool | None = None
        self._told: set[int] = set()
        self._started = time.monotonic()
        self.ending = False
        """True while a look waits for the answer to a holder it asked PostgreSQL to end."""

    def next_look_in(self) -> float:
        """``every_s``, doubled after each failed look (up to 32 times): a database that
        does not answer is not hammered with connections."""
        return float(self._watch.every_s * 2 ** min(self._failures, 5))

    def close(self) -> None:
        self._closed = True
        self._drop()

    def _drop(self) -> None:
        side, self._side = self._side, None
        if side is not None:
            side.terminate()

    async def look(self) -> None:
        if self._visible is False:
            return  # the claim's session cannot be seen (said once): nothing to look at
        try:
            if self._side is None:
                side = await self._watch.connect()
                if self._closed:  # the claim ended while this connected
                    side.terminate()
                    return
                self._side = side
            await self._end_stuck(self._side)
            self._failures = 0
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the look is best effort: the claim goes on waiting
            if self._failures == 0:
                log.warning(
                    "claim: cannot see what partitions %s wait for: %s",
                    self._numbers,
                    describe(exc),
                )
            self._failures += 1
            self._drop()

    async def _end_stuck(self, side: asyncpg.Connection) -> None:
        if self._visible is None:
            self._visible = bool(await side.fetchval(_VISIBLE, self._pid))
            if not self._visible:
                log.error(
                    "claim of partitions %s cannot be watched: its session (pid %d) is not "
                    "in pg_stat_activity (a pooler between the worker and PostgreSQL?); "
                    "a previous owner stuck mid-batch would not be ended",
                    self._numbers,
                    self._pid,
                )
        if not self._visible:
            self._drop()
            return
        waited = time.monotonic() - self._started
        for r in await side.fetch(_BLOCKERS, self._pid):
            b = Blocker(
                int(r["pid"]),
                r["backend_start"],
                r["usename"],
                r["application_name"],
                r["state"],
                r["wait_event"],
                r["state_change"],
                r["waited_s"],
            )
            who = f"session {b.pid} ({b.user}, {b.application_name})"
            if b.state is None:
                if waited > self._watch.stuck_after_s / 2:
                    self._tell(b.pid, f"{who} of another role, whose state this role may not read")
                continue
            if not is_stuck(b, self._watch.stuck_after_s):
                continue
            self.ending = True
            try:
                ended = await side.fetchval(_END_BLOCKER, b.pid, b.backend_start, b.state_change)
            except asyncpg.InsufficientPrivilegeError as exc:
                self._tell(b.pid, f"{who}, stuck on its client for {b.waited_s:.0f} s ({exc})")
                continue
            finally:
                self.ending = False
            if ended:
                log.warning(
                    "claim: ended %s, which held the offset rows of partitions %s while "
                    "waiting on its client for %.0f s (a previous owner stopped mid-batch: "
                    "its transaction rolls back, nothing of it is committed)",
                    who,
                    self._numbers,
                    b.waited_s,
                )

    def _tell(self, pid: int, what: str) -> None:
        """One ERROR line per claim attempt for each blocker this worker may not end."""
        if pid in self._told:
            return
        self._told.add(pid)
        log.error(
            "claim of partitions %s waits for %s: end it if it is stuck (this role may not), "
            "or run every worker of the group as one role",
            self._numbers,
            what,
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
