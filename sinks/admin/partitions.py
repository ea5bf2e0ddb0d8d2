"""Time partitions of ``activity``: made ahead, listed, dropped by retention.

``activity`` is partitioned by ``ingested_on``, the UTC day of the database's clock on which
a batch's transaction ran (docs/retention.md says why ingest time and not ``occurred_at``).
The DDL lives in SQL functions of migration ``0008_activity_partitioned.sql``: partition
names are identifiers, which cannot be bind parameters, and the SQL sent from here is
static. The functions serialize on one advisory lock, so workers and the operator may call
them at the same time.

* :func:`ensure_partitions` makes the partitions of today and the next ``ahead`` intervals
  (a day or an ISO week). Each is created empty and then attached: the parent is locked in
  SHARE UPDATE EXCLUSIVE mode only, so ingest and readers go on.
* :func:`apply_retention` (the operator) records the retention policy and detaches and
  drops every partition whose rows were all ingested before ``now - keep``; the dedup keys
  stay in ``txn_ledger`` and ``event_keys``. A partition that a changefeed reader has not
  finished is kept (and named) unless ``force``.
* :class:`Upkeep` is what a worker's writers do between their batches: partitions ahead, and its
  ``ACKLINE_RETENTION`` if the operator has set a policy (never below it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Final, Literal

import asyncpg

from ackline.sinks.admin.durations import format_duration
from ackline.sinks.errors import SinkError

log = logging.getLogger(__name__)

Interval = Literal["day", "week"]

LEGACY: Final = "activity_legacy"
"""The partition holding the rows stored before migration 0008 (day key '-infinity')."""


class PartitionError(SinkError):
    """A partition could not be made or dropped (the reason is PostgreSQL's)."""


@dataclass(frozen=True, slots=True)
class Partition:
    """One partition of activity. ``lower_day`` is None for :data:`LEGACY`."""

    name: str
    lower_day: date | None
    upper_day: date | None
    ends_before: datetime
    approx_rows: int
    bytes: int

    def describe(self) -> str:
        if self.lower_day is None or self.upper_day is None:
            return f"{self.name}: rows stored before partitioning (until {self.ends_before})"
        return f"{self.name}: ingested {self.lower_day} .. {self.upper_day} (exclusive)"


@dataclass(frozen=True, slots=True)
class Created:
    name: str
    lower_day: date
    upper_day: date


@dataclass(frozen=True, slots=True)
class Dropped:
    """A partition retention looked at: dropped, or kept for the readers still behind."""

    name: str
    lower_day: date | None
    upper_day: date | None
    dropped: bool
    readers_behind: tuple[str, ...]


_LIST = """
SELECT p.name, p.lower_day, p.upper_day, p.ends_before,
       greatest(c.reltuples, 0)::bigint AS approx_rows,
       pg_total_relation_size(c.oid) AS bytes
FROM activity_partitions AS p
JOIN pg_class AS c ON c.oid = to_regclass(format('public.%I', p.name))
JOIN pg_inherits AS i ON i.inhrelid = c.oid AND i.inhparent = 'public.activity'::regclass
ORDER BY p.lower_day
"""

_ENSURE = "SELECT partition_name, from_day, until_day FROM ackline_ensure_partitions($1, $2)"
_ENSURE_AT = """
SELECT partition_name, from_day, until_day FROM ackline_ensure_partitions_at($1, $2, $3)
"""
_DROP_BEFORE = """
SELECT partition_name, from_day, until_day, dropped, readers_behind
FROM ackline_drop_partitions_before(coalesce($1::timestamptz, now()) - $2::interval, $3)
"""
_WORKER_RETENTION = """
SELECT partition_name, from_day, until_day, dropped, readers_behind
FROM ackline_apply_retention($1)
"""
_POLICY = "SELECT min_keep FROM retention_policy"
_SET_POLICY = """
UPDATE retention_policy SET min_keep = $1, set_by = session_user, set_at = now()
"""
_MAY_OWN = "SELECT pg_has_role(current_user, 'ackline_migrator', 'MEMBER')"
_BE_OWNER = "SET LOCAL ROLE ackline_migrator"


def _day(value: date) -> date | None:
    """asyncpg maps the legacy partition's '-infinity' and year-1 bounds to date.min."""
    return None if value == date.min else value


def _dropped(r: asyncpg.Record) -> Dropped:
    return Dropped(
        str(r["partition_name"]),
        _day(r["from_day"]),
        _day(r["until_day"]),
        bool(r["dropped"]),
        tuple(r["readers_behind"] or ()),
    )


async def list_partitions(conn: asyncpg.Connection) -> list[Partition]:
    """The partitions of activity, oldest first (row counts are the planner's estimate)."""
    return [
        Partition(
            str(r["name"]),
            _day(r["lower_day"]),
            _day(r["upper_day"]),
            r["ends_before"],
            int(r["approx_rows"]),
            int(r["bytes"]),
        )
        for r in await conn.fetch(_LIST)
    ]


async def ensure_partitions(
    conn: asyncpg.Connection, step: Interval, ahead: int, at: datetime | None = None
) -> list[Created]:
    """Make the missing partitions of [today, today + ``ahead`` intervals]; return them.

    ``at`` None: today by the database's clock (any role with EXECUTE on
    ``ackline_ensure_partitions``, the ingest role included). ``at`` given: today by that
    clock (the operator: ``ackline_ensure_partitions_at``; tests drive a clock with it).
    One autocommitted statement: a crash leaves the partitions it had made, whole.
    """
    try:
        if at is None:
            rows = await conn.fetch(_ENSURE, step, ahead)
        else:
            rows = await conn.fetch(_ENSURE_AT, at, step, ahead)
    except asyncpg.PostgresError as exc:
        raise PartitionError(f"cannot make partitions ahead: {exc}") from exc
    return [Created(str(r[0]), r[1], r[2]) for r in rows]


async def retention_policy(conn: asyncpg.Connection) -> timedelta | None:
    """The operator's min_keep: the least a worker's retention keeps (None: workers drop
    nothing)."""
    value = await conn.fetchval(_POLICY)
    return value if isinstance(value, timedelta) else None


async def apply_retention(
    conn: asyncpg.Connection,
    keep: timedelta,
    *,
    force: bool = False,
    now: datetime | None = None,
    set_policy: bool = True,
) -> list[Dropped]:
    """The operator's retention: drop every partition ingested entirely before
    ``now - keep`` (``now`` None: the database's clock).

    Order of effects, in ONE transaction: take the ackline_migrator role when the user may
    (it owns the partitions); record ``keep`` as the policy that bounds the workers'
    retention (unless ``set_policy`` is False); detach and drop, partition by partition,
    each with its ``retention_drops`` row. A crash before COMMIT leaves nothing dropped and
    the policy as it was. Dropping locks activity in ACCESS EXCLUSIVE mode for the
    detach: it waits for the batch in flight, at most ``lock_timeout`` (10 s) behind a
    long reader, then fails and changes nothing.
    """
    if keep < timedelta(0):
        raise PartitionError("retention cannot be negative")
    try:
        # READ COMMITTED whatever the server's default: the drop function looks at the
        # changefeed readers again after each detach, in a snapshot of its own.
        async with conn.transaction(isolation="read_committed"):
            if await conn.fetchval(_MAY_OWN):
                await conn.execute(_BE_OWNER)
            if set_policy:
                await conn.execute(_SET_POLICY, keep)
            rows = await conn.fetch(_DROP_BEFORE, now, keep, force)
    except asyncpg.PostgresError as exc:
        raise PartitionError(f"retention did not run: {exc}") from exc
    return [_dropped(r) for r in rows]


@dataclass
class Upkeep:
    """A worker's partition and retention upkeep, run by its writers between two of their
    batches (one writer at a time: the others skip it while it runs; a writer's batch
    may be in flight on another connection meanwhile).

    ``run_if_due`` makes the partitions ahead at the first batch and every ``every_s``
    after (an interval ahead, that is at least a day of margin), and applies ``retention``
    (None: off) by ``ackline_apply_retention``, which never keeps less than the operator's
    policy and drops nothing without one. A failure is logged and retried a minute later:
    the partitions made ahead, and the writer's own :meth:`ensure_now` when a COPY finds
    its partition missing, keep ingest going meanwhile.
    """

    step: Interval = "day"
    ahead: int = 2
    retention: timedelta | None = None
    every_s: float = 3600.0
    clock: Callable[[], float] = time.monotonic
    _next: float = 0.0
    _warned: bool = False
    _running: bool = False

    async def run_if_due(self, conn: asyncpg.Connection) -> None:
        """Autocommitted statements on ``conn``, outside any batch transaction.

        Skipped while another writer of the worker runs it: two at once only queued on
        the functions' advisory lock, and a retention drop waiting up to its lock timeout
        then held both connections' batches back instead of one.
        """
        if self._running or self.clock() < self._next:
            return
        self._running = True
        try:
            await self.ensure_now(conn)
            if self.retention is not None:
                await self._retention(conn)
        except PartitionError as exc:
            if isinstance(exc.__cause__, asyncpg.UndefinedFunctionError):
                log.debug("activity is not partitioned yet (migration 0008): %s", exc)
            else:
                log.warning("partition upkeep failed, retrying in 60 s: %s", exc)
            self._next = self.clock() + 60.0
            return
        finally:
            self._running = False
        self._next = self.clock() + self.every_s

    async def ensure_now(self, conn: asyncpg.Connection) -> None:
        for made in await ensure_partitions(conn, self.step, self.ahead):
            log.info("made partition %s (%s .. %s)", made.name, made.lower_day, made.upper_day)

    async def _retention(self, conn: asyncpg.Connection) -> None:
        keep = self.retention
        if keep is None:
            return
        try:
            least = await retention_policy(conn)
            if least is None:
                if not self._warned:
                    self._warned = True
                    log.warning(
                        "ACKLINE_RETENTION=%s is not applied: the operator has set no "
                        "retention policy (`ackline retention apply --older-than %s`)",
                        format_duration(keep),
                        format_duration(keep),
                    )
                return
            # READ COMMITTED whatever the server's default: the drop function looks at
            # the changefeed readers again after each detach, in a snapshot of its own.
            async with conn.transaction(isolation="read_committed"):
                rows = await conn.fetch(_WORKER_RETENTION, keep)
        except asyncpg.PostgresError as exc:
            raise PartitionError(f"retention did not run: {exc}") from exc
        for d in map(_dropped, rows):
            if d.dropped:
                log.info("retention dropped partition %s", d.name)
            else:
                log.warning(
                    "retention kept partition %s: changefeed readers %s have not read it all",
                    d.name,
                    ", ".join(d.readers_behind),
                )
