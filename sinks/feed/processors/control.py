"""The ``processors`` table: registration, filter in effect, pause, failure, heartbeat,
lag, status, reset.

A processor's cursor is its ``feed_cursors`` row (the changefeed's); this module keeps
the rest of its state. Every function here is a few static statements; which role runs
them is in each docstring (the processor role may register, take over with its filter,
report and heartbeat; pausing, resuming and resetting are the operator's).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from ackline.core.faults import DISARMED, Faults
from ackline.sinks.errors import FeedError
from ackline.sinks.feed.gaps import drops, lost_after
from ackline.sinks.feed.types import START, Cursor, stored_cursor

_REGISTER = """
INSERT INTO processors (name)
SELECT $1::text WHERE NOT EXISTS (SELECT 1 FROM processors WHERE name = $1::text)
ON CONFLICT (name) DO NOTHING
"""

_REGISTERED = "SELECT paused, failed_at, error, error_event_id FROM processors WHERE name = $1"

_PAUSED = "SELECT paused FROM processors WHERE name = $1"

_WRITTEN_HERE = """
SELECT xmin = pg_current_xact_id()::xid FROM feed_cursors WHERE reader = $1
"""

_CLEAR_FAILURE = (
    """
WITH cleared AS (
    UPDATE processors
    SET failed_at = NULL, error = NULL, error_event_id = NULL, error_cursor = NULL
    WHERE name = $1 AND failed_at IS NOT NULL
)"""
    + _WRITTEN_HERE
)

_FAILED = """
UPDATE processors
SET failed_at = now(), error = $2, error_event_id = $3, error_cursor = $4, last_instance = $5
WHERE name = $1
  -- only while the cursor is still where the failed batch began (or none was ever saved):
  -- an instance that committed past it meanwhile has already cleared the failure
  AND ($6::xid8 IS NULL
       OR NOT EXISTS (SELECT 1 FROM feed_cursors AS c WHERE c.reader = $1)
       -- FOR SHARE: a batch moving the cursor is waited for, and its new cursor checked
       OR EXISTS (SELECT 1 FROM feed_cursors AS c
                  WHERE c.reader = $1 AND c.position = $6::xid8
                    AND c.within_batch IS NOT DISTINCT FROM $7::bigint
                    AND c.within_partition IS NOT DISTINCT FROM $8::int
                    AND c.within_offset IS NOT DISTINCT FROM $9::bigint
                    AND c.within_topic IS NOT DISTINCT FROM $10::text
                  FOR SHARE))
"""

_HEARTBEAT = """
UPDATE processors SET last_seen_at = now(), last_instance = $2 WHERE name = ANY($1::text[])
"""

# The lag after cursor c: the items of the feed's transactions past it (a transaction it
# is inside of counts whole): a batch's inserted rows (erased ones too: an upper bound),
# an erasure's notices, one per erased event. No rows where c has none (no cursor).
_LAG_AFTER_CURSOR = """
LEFT JOIN LATERAL (
    SELECT sum(t.events) AS events, min(t.at) AS oldest
    FROM (SELECT b.commit_xid, b.inserted AS events, b.committed_at AS at FROM ingest_batches AS b
          UNION ALL
          SELECT e.commit_xid, e.events, e.erased_at FROM erasures AS e) AS t
    WHERE t.commit_xid >= c.position
      AND (t.commit_xid > c.position OR c.within_batch IS NOT NULL)
) AS l ON true
"""

_LAG = (
    """
SELECT c.reader AS name, coalesce(l.events, 0) AS events,
       coalesce(extract(epoch FROM now() - l.oldest), 0)::float8 AS seconds, p.paused
FROM feed_cursors AS c
JOIN processors AS p ON p.name = c.reader"""
    + _LAG_AFTER_CURSOR
    + """WHERE c.reader = ANY($1::text[])
"""
)

_FILTER = """
SELECT filter, filter_at, filter_instance, superseded_filters FROM processors WHERE name = $1
"""

_TAKE_OVER = """
UPDATE processors
SET filter = $2, filter_at = now(), filter_instance = $3,
    superseded_filters = CASE WHEN filter IS NULL THEN superseded_filters
                              ELSE array_append(array_remove(superseded_filters, filter), filter)
                         END
WHERE name = $1 AND filter IS DISTINCT FROM $2
"""

_CLEAR_SUPERSEDED = "UPDATE processors SET superseded_filters = '{}' WHERE name = $1"
_NAMES = "SELECT name FROM processors ORDER BY name"

_NAME_FILTER = "SELECT set_config('ackline.processor_filter', $1, false)"

# The operator's reset moves the cursor whatever filter is in effect: it names that one,
# for its own transaction only.
_NAME_FILTER_IN_EFFECT = """
SELECT set_config('ackline.processor_filter', coalesce(ackline_processor_filter($1), ''), true)
"""

GUARD_SQLSTATE = "AKSP1"
"""Raised by migration 0012's trigger when a session moves a processor's cursor under a
filter that is not the one in effect."""

_STATUS = (
    """
SELECT p.name, p.paused, p.paused_at, p.failed_at, p.error, p.error_event_id, p.error_cursor,
       p.last_instance, p.last_seen_at, p.registered_at,
       p.filter, p.filter_at, p.filter_instance, p.superseded_filters,
       c.position::text AS position, c.within_batch, c.within_partition, c.within_offset,
       c.within_topic, c.transactions, c.delivered, c.erased, c.updated_at AS last_commit_at,
       coalesce(l.events, 0) AS lag_events,
       coalesce(extract(epoch FROM now() - l.oldest), 0)::float8 AS lag_seconds
FROM processors AS p
LEFT JOIN feed_cursors AS c ON c.reader = p.name"""
    + _LAG_AFTER_CURSOR
    + """WHERE $1::text[] IS NULL OR p.name = ANY($1::text[])
ORDER BY p.name
"""
)

_PAUSE = """
UPDATE processors SET paused = $2, paused_at = CASE WHEN $2 THEN now() END WHERE name = $1
"""

_HEAD = """
SELECT greatest(
           -- one table each, so that the planner answers max() from the commit_xid index
           (SELECT max(b.commit_xid) FROM ingest_batches AS b
            WHERE b.commit_xid < pg_snapshot_xmin(pg_current_snapshot())),
           -- erasures are transactions of the feed too
           (SELECT max(e.commit_xid) FROM erasures AS e
            WHERE e.commit_xid < pg_snapshot_xmin(pg_current_snapshot())),
           '0'::xid8
       )::text AS head,
       pg_current_xact_id_if_assigned() AS own
"""

_LOCK_CURSOR = "SELECT version FROM feed_cursors WHERE reader = $1 FOR UPDATE"

_LOCK_CURSOR_AT = """
SELECT position::text AS xid, within_batch, within_partition, within_offset, within_topic
FROM feed_cursors WHERE reader = $1 FOR UPDATE
"""

# Whether the feed holds a transaction in (from, to] (from itself too when $3: a cursor
# stopped inside it) with an event still in it, by the commit_xid and batch indexes (a
# batch whose rows retention dropped, or erasure or replay, and an erasure that erased
# nothing, hold none), or may still get one there.
_SKIPS = """
SELECT EXISTS (SELECT 1 FROM ingest_batches AS b
               WHERE b.inserted > 0 AND b.commit_xid >= $1::xid8 AND b.commit_xid <= $2::xid8
                 AND (b.commit_xid > $1::xid8 OR $3::boolean)
                 AND EXISTS (SELECT 1 FROM activity AS a WHERE a.batch_id = b.batch_id))
    OR EXISTS (SELECT 1 FROM erasures AS e
               WHERE e.events > 0 AND e.commit_xid >= $1::xid8 AND e.commit_xid <= $2::xid8
                 AND (e.commit_xid > $1::xid8 OR $3::boolean))
    -- past the readable feed: a transaction at or below `to` may still be running, and
    -- its batch would commit behind the cursor (the head is below this, always)
    OR $2::xid8 >= pg_snapshot_xmin(pg_current_snapshot())
"""

# Retention's lock (schemas/sql/0011's ackline_drop_partitions_before takes it first): held
# by a rebuild from its gap check to its COMMIT, so that no drop commits in between, reads
# the processor's cursor as it was and takes what the rebuild was checked to still have.
# It assigns no xid.
_RETENTION_LOCK = "SELECT pg_advisory_xact_lock(1094929232)"

# The newest transaction of the feed, whatever the horizon: a cursor past it is past the
# feed (a database restored or failed over behind its readers, docs/changefeed.md).
_NEWEST = """
SELECT greatest(
           (SELECT max(b.commit_xid) FROM ingest_batches AS b),
           (SELECT max(e.commit_xid) FROM erasures AS e),
           '0'::xid8
       )::text AS newest
"""

_REWIND = """
UPDATE feed_cursors
SET position = $2::xid8, within_batch = $3, within_partition = $4, within_offset = $5,
    within_topic = $6, version = version + 1, transactions = 0, delivered = 0, erased = 0,
    updated_at = now()
WHERE reader = $1
"""


async def register(conn: asyncpg.Connection, name: str) -> None:
    """Create the processor's control row unless it exists (autocommitted, idempotent).

    As the processor role, row-level security refuses a name whose cursor belongs to
    another reader: that is a FeedError here, not a hijacked cursor.
    """
    try:
        await conn.execute(_REGISTER, name)
    except asyncpg.InsufficientPrivilegeError as exc:
        if await conn.fetchrow(_REGISTERED, name) is not None:
            return  # registered meanwhile by another instance
        raise FeedError(
            f"processor {name!r}: cannot register it ({exc}); a changefeed reader of that "
            "name already exists and is not a processor, or this role may not write "
            "processors (run `ackline migrate`)"
        ) from exc


@dataclass(frozen=True, slots=True)
class InEffect:
    """The filter that moves a processor's cursor (``processors.filter``: the fingerprint,
    :func:`ackline.sinks.feed.processors.contract.fingerprint`; None: never recorded),
    and when and by which instance it was recorded."""

    filter: str | None
    since: datetime | None
    instance: str | None
    superseded: tuple[str, ...] = ()

    def took_over(self) -> str:
        """Who recorded it, when, and what: for error lines."""
        since = "-" if self.since is None else self.since.isoformat()
        return f"instance {self.instance or '-'} took over at {since} with filter {self.filter}"


class Superseded(FeedError):
    """Another filter than this instance's is in effect, or this one's was replaced
    before: the instance must not move the cursor (nothing of its batch was applied)."""


async def name_filter(conn: asyncpg.Connection, feed_filter: str) -> None:
    """Name this session's filter (a fingerprint) for the database's guard (0012's trigger
    on ``feed_cursors``): a cursor update of a processor whose recorded filter differs is
    refused with SQLSTATE :data:`GUARD_SQLSTATE`. For the session (every later
    transaction on ``conn``); no effect of its own."""
    await conn.execute(_NAME_FILTER, feed_filter)


def refused_by_guard(exc: BaseException) -> bool:
    """True for the guard's refusal (the batch rolled back): another filter is in effect."""
    return getattr(exc, "sqlstate", None) == GUARD_SQLSTATE


async def filter_in_effect(conn: asyncpg.Connection, name: str) -> InEffect:
    """One read of the processor's row (None everywhere if it has none): the takeover's
    look under the cursor row lock, and the runner's, to say who took over."""
    r = await conn.fetchrow(_FILTER, name)
    if r is None:
        return InEffect(None, None, None)
    return InEffect(
        r["filter"], r["filter_at"], r["filter_instance"], tuple(r["superseded_filters"])
    )


async def take_over(
    conn: asyncpg.Connection, name: str, feed_filter: str, instance: str
) -> InEffect:
    """Record ``feed_filter`` (a fingerprint) as the processor's filter in effect, unless it
    already is: an instance that starts takes over the cursor. Returns what was recorded
    before. The processor role runs it, at start, after its cursor row exists.

    A filter that a takeover replaced before (``superseded_filters``) does not take over
    again: :class:`Superseded` is raised and nothing changes. Otherwise an old instance
    that an orchestrator restarts during a rollout would take over back, and pass the new
    types over until the new instances took over again. :func:`clear_superseded` (the
    operator's) allows it, for a deliberate rollback.

    Order of effects: read the recorded filter (autocommitted); if it is ``feed_filter``,
    nothing else (a restart with an unchanged filter waits for no one). Otherwise BEGIN;
    lock the cursor row (``FOR UPDATE``: a batch of another instance in flight commits or
    rolls back first, with the filter it read); read the recorded filter again; if
    ``feed_filter`` was superseded, roll back (nothing changed) and raise; else record
    this one, with the time and ``instance``, adding the one it replaces to
    ``superseded_filters``; COMMIT. Every cursor update after this COMMIT is held to the
    new filter by 0012's trigger (another instance's batch rolls back, see the runner). A
    crash before COMMIT changes nothing (the old filter stays in effect; the next start
    takes over again); after it, the new filter is in effect.
    """
    if conn.is_in_transaction():
        raise FeedError("take_over needs a connection that is not in a transaction")
    try:
        before = await filter_in_effect(conn, name)
        if before.filter == feed_filter:
            return before
        async with conn.transaction():
            if await conn.fetchrow(_LOCK_CURSOR, name) is None:
                raise FeedError(f"processor {name!r} has no cursor row to take over")
            before = await filter_in_effect(conn, name)
            if before.filter != feed_filter and feed_filter in before.superseded:
                raise Superseded(
                    f"instance {instance} (filter {feed_filter}) does not take over: that "
                    f"filter was replaced, and {before.took_over()}. A replaced filter does not "
                    "take over again by itself (an old instance restarted mid-rollout "
                    "would pass the new types over): finish the rollout, or, to go back "
                    f"to it on purpose, run `ackline processors clear-superseded {name}` "
                    "and start this version again"
                )
            await conn.execute(_TAKE_OVER, name, feed_filter, instance)
    except asyncpg.UndefinedColumnError as exc:
        raise FeedError(
            f"processor {name!r}: processors.filter is missing ({exc}); run `ackline migrate` "
            "(0012_processor_filter.sql) before starting processors of this version"
        ) from exc
    return before


async def is_paused(conn: asyncpg.Connection, name: str) -> bool:
    return bool(await conn.fetchval(_PAUSED, name))


async def clear_failure(conn: asyncpg.Connection, name: str) -> bool:
    """Inside a batch's transaction: the batch commits past where the processor stopped.
    Touches (and locks) the row only when it holds a failure. True when the cursor row was
    last written by this very transaction (its compare-and-set): False when the
    processor's ``apply`` ended the batch's transaction and began another (a COMMIT or
    ROLLBACK, then BEGIN), in the same round trip."""
    return bool(await conn.fetchval(_CLEAR_FAILURE, name))


async def cursor_written_here(conn: asyncpg.Connection, name: str) -> bool:
    """Whether the cursor row was last written by the transaction open on ``conn`` (see
    :func:`clear_failure`)."""
    return bool(await conn.fetchval(_WRITTEN_HERE, name))


async def record_failure(
    conn: asyncpg.Connection,
    name: str,
    error: str,
    event_id: uuid.UUID | None,
    cursor: Cursor | None,
    instance: str,
) -> None:
    """Autocommitted, after the failed batch rolled back: where the processor stopped.
    Nothing is recorded when the saved cursor is no longer ``cursor``: another instance
    committed past the failure while this one stopped (a rolling deploy of a fix), and a
    late record would show a processor that is moving as failed."""
    w = None if cursor is None else cursor.within
    await conn.execute(
        _FAILED,
        name,
        error[:2000],
        event_id,
        None if cursor is None else cursor.encode(),
        instance,
        None if cursor is None else cursor.xid,
        *((None,) * 4 if w is None else (w.batch_id, w.partition, w.offset, w.topic)),
    )


async def heartbeat(conn: asyncpg.Connection, names: list[str], instance: str) -> None:
    await conn.execute(_HEARTBEAT, names, instance)


@dataclass(frozen=True, slots=True)
class Lag:
    """Ingested events and erasure notices after a processor's cursor (a transaction it is
    inside of counts whole), and the age of the oldest of their transactions (0 when
    caught up)."""

    name: str
    events: int
    seconds: float
    paused: bool


async def lags(conn: asyncpg.Connection, names: list[str]) -> list[Lag]:
    rows = await conn.fetch(_LAG, names)
    return [
        Lag(str(r["name"]), int(r["events"]), float(r["seconds"]), bool(r["paused"])) for r in rows
    ]


@dataclass(frozen=True, slots=True)
class Status:
    """One processor as `ackline processors status` shows it."""

    name: str
    paused: bool
    failed_at: datetime | None
    error: str | None
    error_event_id: uuid.UUID | None
    error_cursor: str | None
    last_instance: str | None
    last_seen_at: datetime | None
    last_commit_at: datetime | None
    cursor: str | None
    transactions: int
    delivered: int
    lag_events: int
    lag_seconds: float
    filter: str | None = None  # the filter in effect (a fingerprint); None: never recorded
    filter_at: datetime | None = None
    filter_instance: str | None = None
    superseded_filters: tuple[str, ...] = ()  # replaced filters: they never take over again
    erased: int = 0
    """Erasure notices among ``delivered`` (feed_cursors.erased, counted from migration
    0013 on): not events."""

    @property
    def applied(self) -> int:
        """Events applied since the cursor was made or reset: ``delivered`` less the
        erasure notices (the runner's own ``applied`` does the same)."""
        return self.delivered - self.erased

    @property
    def state(self) -> str:
        if self.failed_at is not None:
            return "failed"
        if self.paused:
            return "paused"
        return "ok"

    def to_json(self) -> dict[str, Any]:
        def iso(t: datetime | None) -> str | None:
            return None if t is None else t.isoformat()

        return {
            "name": self.name,
            "state": self.state,
            "paused": self.paused,
            "cursor": self.cursor,
            "applied": self.applied,
            "erased": self.erased,
            "delivered": self.delivered,
            "transactions": self.transactions,
            "lag_events": self.lag_events,
            "lag_seconds": round(self.lag_seconds, 3),
            "last_commit_at": iso(self.last_commit_at),
            "last_seen_at": iso(self.last_seen_at),
            "last_instance": self.last_instance,
            "failed_at": iso(self.failed_at),
            "error": self.error,
            "error_event_id": None if self.error_event_id is None else str(self.error_event_id),
            "error_cursor": self.error_cursor,
            "filter": self.filter,
            "filter_at": iso(self.filter_at),
            "filter_instance": self.filter_instance,
            "superseded_filters": list(self.superseded_filters),
        }


def _cursor_text(r: asyncpg.Record) -> str | None:
    return None if r["position"] is None else stored_cursor(r).encode()


async def statuses(conn: asyncpg.Connection, names: list[str] | None = None) -> list[Status]:
    """Read-only; any role that may read the tables (the reader role included)."""
    try:
        rows = await conn.fetch(_STATUS, names)
    except asyncpg.UndefinedColumnError as exc:
        raise FeedError(
            f"{exc}: run `ackline migrate` (0013_feed_cursor_erased.sql) before the "
            "processors status of this version"
        ) from exc
    return [
        Status(
            name=str(r["name"]),
            paused=bool(r["paused"]),
            failed_at=r["failed_at"],
            error=r["error"],
            error_event_id=r["error_event_id"],
            error_cursor=r["error_cursor"],
            last_instance=r["last_instance"],
            last_seen_at=r["last_seen_at"],
            last_commit_at=r["last_commit_at"],
            cursor=_cursor_text(r),
            transactions=int(r["transactions"] or 0),
            delivered=int(r["delivered"] or 0),
            erased=int(r["erased"] or 0),
            lag_events=int(r["lag_events"]),
            lag_seconds=float(r["lag_seconds"]),
            filter=r["filter"],
            filter_at=r["filter_at"],
            filter_instance=r["filter_instance"],
            superseded_filters=tuple(r["superseded_filters"]),
        )
        for r in rows
    ]


async def clear_superseded(conn: asyncpg.Connection, name: str) -> None:
    """The operator's: let any filter take over again (a deliberate rollback to a filter
    replaced before). Autocommitted; the filter in effect stays until an instance with
    another one starts."""
    status = await conn.execute(_CLEAR_SUPERSEDED, name)
    if status != "UPDATE 1":
        raise await no_such_processor(conn, [name])


async def no_such_processor(conn: asyncpg.Connection, names: list[str]) -> FeedError:
    """The error for ``names`` that no processor registered: one line naming those that
    did (a typo is then plain), read-only."""
    registered = [str(r["name"]) for r in await conn.fetch(_NAMES)]
    return FeedError(unknown_processors_line(names, registered))


def unknown_processors_line(names: list[str], registered: list[str]) -> str:
    """One line: which of ``names`` is no registered processor, and which are. Pure."""
    which = ", ".join(repr(n) for n in names)
    known = ", ".join(registered) if registered else "none yet"
    return (
        f"no processor named {which} (registered: {known}; a processor registers when it "
        "first runs)"
    )


async def set_paused(conn: asyncpg.Connection, name: str, paused: bool) -> None:
    """The operator's: pause or resume (autocommitted). Running instances read the flag
    before each batch, so a pause takes effect at the next batch boundary."""
    status = await conn.execute(_PAUSE, name, paused)
    if status != "UPDATE 1":
        raise await no_such_processor(conn, [name])


async def head(conn: asyncpg.Connection) -> Cursor:
    """The cursor just past every batch and erasure readable now: a processor started here
    sees only what commits later. One statement, read before the transaction holds an xid."""
    r = await conn.fetchrow(_HEAD)
    if r is None or r["own"] is not None:
        raise FeedError("the feed head was read in a transaction that holds an xid")
    return Cursor(int(r["head"]))


async def _refuse_a_gap(conn: asyncpg.Connection, name: str, target: Cursor) -> None:
    """Raise FeedError when a rebuild from ``target`` would lack events retention dropped.

    Every drop after ``target`` counts, also one made before the processor first ran
    (its state never held those events): no clock tells them apart safely. A drop's
    transaction may wait on this very lock, or at its DETACH, while a processor is made
    and reads the partition, and a cursor row deleted by hand is made anew with the
    state kept (a review reproduced both). The refusal says when --accept-gap is safe."""
    try:
        recorded = await drops(conn)
    except asyncpg.UndefinedColumnError as exc:
        raise FeedError(
            f"retention_drops has no up_to column ({exc}): run `ackline migrate` "
            "(0014_retention_drops_up_to.sql) before a rebuild"
        ) from exc
    except asyncpg.InsufficientPrivilegeError as exc:
        raise FeedError(
            f"cannot read retention_drops to tell whether a rebuild of "
            f"{name!r} would lack dropped events ({exc}); --accept-gap rebuilds without that check"
        ) from exc
    lost = lost_after(recorded, target)
    if lost:
        last = lost[-1]
        raise FeedError(
            f"not rebuilding {name!r} from cursor {target.encode()}: retention dropped "
            f"{len(lost)} partition(s) holding events after it (the last "
            f"{last.describe()}), which the feed no "
            f"longer holds, so what {name!r} derived from them would be lost for good; "
            f"--accept-gap rebuilds anyway (it loses nothing if {name!r} first ran after "
            "that drop, or was rebuilt with --accept-gap since)"
        )


async def _refuse_a_skip(conn: asyncpg.Connection, name: str, current: Cursor, to: Cursor) -> None:
    """Raise FeedError when moving ``name``'s cursor from ``current`` to ``to`` with its
    state kept passes transactions of the feed it has not read (its own transaction too
    when ``current`` stops inside it), or goes past the readable feed, where a transaction
    still running would commit behind it. Any such transaction counts, whatever the
    processor's filter: the check errs towards refusing. It reads ``activity``: a
    retention drop of a partition it reads waits for this transaction."""
    if to.sort_key() <= current.sort_key():
        return
    if await conn.fetchval(_SKIPS, current.xid, to.xid, current.within is not None):
        raise FeedError(
            f"not moving {name!r} forward from cursor {current.encode()} to {to.encode()} "
            "with its state kept: the feed holds events between them that it has not read "
            "(or may still: a cursor past the readable feed), and those its filter takes "
            "would never be applied (for the dispatcher: requests never started); "
            "--skip-events moves it anyway"
        )


async def reset(
    conn: asyncpg.Connection,
    name: str,
    to: Cursor | None = START,
    clear: Callable[[asyncpg.Connection], Awaitable[object]] | None = None,
    accept_gap: bool = False,
    faults: Faults = DISARMED,
    skip_events: bool = False,
) -> Cursor:
    """Rewind a processor to ``to`` (None: the feed head now) and clear its failure, in
    one transaction with ``clear(conn)``, which deletes the processor's own state: the
    operator's ``ackline processors reset``. Returns the new cursor.

    A rebuild (``clear``) from a cursor before events retention dropped is refused unless
    ``accept_gap``: the feed no longer holds what the drop took, so the rebuilt state
    would lack it for good (a review found docs/retention.md advising such a rebuild
    after an erasure). A reset that keeps the state is not checked for that, but one that
    moves the cursor forward past transactions the feed holds is refused unless
    ``skip_events``: their events would never be applied (the dispatcher's requests never
    started), where the operator was told such a reset loses nothing (a review).

    Order of effects: BEGIN; read the head (before any xid; a rebuild from a cursor past
    it is refused: it would skip what commits until the xids reach it); the
    reset_after_head point; for a rebuild, take retention's lock (a drop then waits for
    this COMMIT and sees the rewound cursor behind it) and check for a gap; name the
    filter in effect for this transaction (0012's guard holds every cursor update to it);
    lock the cursor row (an instance with a batch in flight commits first; its next
    compare-and-set then fails and it reads on from the new cursor); with the state kept,
    check that a move forward skips nothing (a refusal raises: everything rolls back);
    ``clear``; rewind; clear the failure; COMMIT. ``skip_events`` is looked at only with
    the state kept. A crash before COMMIT changes
    nothing; after it, the processor's next batch starts at ``to`` with nothing of the old
    state left.

    To the head with the state kept (``to`` None, no ``clear``), the cursor never moves
    back within the feed: batches an instance committed between the head's read and the
    lock are in the kept state, and a rewind to the head read earlier applied them again
    (a review). A cursor past the feed's newest transaction is still moved back to the
    head (the failover case). With ``clear`` the state is gone and the head read is the
    rebuild's start.
    """
    if conn.is_in_transaction():
        raise FeedError("reset needs a connection that is not in a transaction")
    async with conn.transaction():
        readable = await head(conn)  # read first: before this transaction holds an xid
        target = readable if to is None else to
        if clear is not None and target.xid > readable.xid:
            # past the readable feed: the rebuilt processor would skip every transaction
            # until the xids reach it (nothing else refused this: an operator's typo)
            raise FeedError(
                f"not rebuilding {name!r} from cursor {target.encode()}: it is past the "
                f"readable feed (its head is {readable.encode()} now), and every event "
                "committed until the xids reach it would never be applied; take a cursor "
                "from `ackline processors status`, or reset without --to-cursor"
            )
        await faults.ahit("reset_after_head")
        if clear is not None and not accept_gap:
            await conn.execute(_RETENTION_LOCK)  # a drop waits for this reset to commit
            await _refuse_a_gap(conn, name, target)
        await conn.execute(_NAME_FILTER_IN_EFFECT, name)
        at = await conn.fetchrow(_LOCK_CURSOR_AT, name)
        if at is None:
            raise FeedError(f"processor {name!r} has no cursor yet (it has never run)")
        current = stored_cursor(at, "xid")
        if to is None and clear is None:
            newest = int(await conn.fetchval(_NEWEST))
            if current.xid <= newest:  # else past the feed: to the head
                target = max(target, current, key=Cursor.sort_key)
        if clear is None and not skip_events:
            await _refuse_a_skip(conn, name, current, target)
        if clear is not None:
            await clear(conn)
        w = target.within
        await conn.execute(
            _REWIND,
            name,
            target.xid,
            *((None,) * 4 if w is None else (w.batch_id, w.partition, w.offset, w.topic)),
        )
        await conn.execute(_CLEAR_FAILURE, name)
    return target
