"""The follow loop of a changefeed reader: LISTEN, read, handle, commit, wait.

A reader is anything with ``position(conn)``, ``next_batch(conn, limit)`` (an async
context manager yielding a :class:`~ackline.sinks.feed.types.FeedBatch`) and ``feed``
(its :class:`~ackline.sinks.feed.changefeed.Changefeed`: the size of a read, and the
count of reads the server cancelled): the stored
:class:`ackline.sinks.feed.changefeed.Reader` or the in-memory
:class:`ackline.sinks.feed.changefeed.LocalReader`.
The loop owns one connection, LISTENs on :data:`CHANNEL` (writers notify inside each
batch transaction; PostgreSQL delivers on COMMIT only) and falls back to polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import asyncpg

from ackline.sinks.connection import (
    Bounds,
    bound_socket,
    drop,
    is_transient,
    link_settings,
    went_away,
)
from ackline.sinks.errors import FeedError
from ackline.sinks.feed.gaps import Drop, Told, drops, newest_drop
from ackline.sinks.feed.types import START, Cursor, FeedBatch

log = logging.getLogger(__name__)
T = TypeVar("T")

CHANNEL = "ackline_batches"
"""The writer's ``pg_notify`` channel (ackline.sinks.ingest.writer); the payload is the batch id."""

HELD_WARN_AFTER_S = 5.0
"""How long committed batches may wait behind an open transaction before the reader says
which transaction it is (and again every :data:`HELD_WARN_EVERY_S`)."""
HELD_WARN_EVERY_S = 30.0

LAST_LOOK_S = 5.0
"""How long a one-shot read that has ended waits for its last look (a host that died then
must not hold a finished read open: the close after it is bounded the same)."""

RECONNECT_SAY_EVERY_S = 60.0
"""During one outage a reader says it is reconnecting at WARNING at most this often."""

GAP_LOOK_EVERY_S = 5.0
"""How often a running reader looks whether retention dropped a partition since it last
looked (:class:`GapWatch`): one read of the newest ``drop_id``, between two reads."""

_HOLDER = """
SELECT kind, id, database, name, state,
       extract(epoch FROM now() - since)::float8 AS open_s
FROM (
    SELECT 'session' AS kind, pid::text AS id, datname::text AS database,
           application_name AS name, state, xact_start AS since, age(backend_xid) AS age
    FROM pg_stat_activity
    WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()
    UNION ALL
    SELECT 'prepared transaction', gid, database::text, owner::text, 'prepared', prepared,
           age(transaction)
    FROM pg_prepared_xacts
) AS h
ORDER BY age DESC
LIMIT 1
"""


Handler = Callable[[asyncpg.Connection, FeedBatch], Awaitable[T]]


@dataclass(frozen=True, slots=True)
class Committed(Generic[T]):
    """A batch whose cursor update committed, with what the handler returned."""

    batch: FeedBatch
    result: T


class _Sized(Protocol):
    @property
    def max_events(self) -> int: ...

    @property
    def cancelled(self) -> int: ...

    @property
    def window(self) -> int: ...


class AnyReader(Protocol):
    name: str
    stored: bool  # its cursor is a row of feed_cursors

    @property
    def feed(self) -> _Sized: ...

    async def position(self, conn: asyncpg.Connection) -> Cursor: ...

    def next_batch(
        self, conn: asyncpg.Connection, limit: int | None = None
    ) -> AbstractAsyncContextManager[FeedBatch]: ...


async def follow(
    reader: AnyReader,
    connect: Callable[[], Awaitable[asyncpg.Connection]],
    handle: Handler[T],
    stop: asyncio.Event,
    *,
    wait: bool = True,
    poll_interval: float = 2.0,
    limit: int | None = None,
    batch_events: int | None = None,
    on_commit: Callable[[Committed[T]], None] | None = None,
    on_transient: Callable[[BaseException], None] | None = None,
    idle_in_transaction_s: float | None = None,
    on_end: Callable[[], None] = lambda: None,
    gaps: GapWatch | None = None,
) -> Cursor:
    """Run ``handle(conn, batch)`` inside each of ``reader``'s batches until ``stop``.

    Returns the reader's last cursor. With ``wait`` False it returns once caught up
    (nothing readable, and nothing committed waiting behind an open transaction); with
    ``limit`` it returns after that many events; ``batch_events`` caps each batch (a
    cut inside an ingest transaction resumes there). Between reads it sleeps until a NOTIFY
    on :data:`CHANNEL`, ``stop``, or ``poll_interval`` (50 ms while batches are pending
    behind an open transaction: their readiness sends no notification). Transient
    database errors reconnect with backoff; the stored cursor decides where the next
    read starts, so a batch whose COMMIT outcome was unknown is neither lost nor
    repeated (it is then missing from ``on_commit`` and the reader's stats, which count
    confirmed commits only). ``on_end`` runs when the loop ends by itself (caught up
    without ``wait``, or ``limit`` reached), not at a stop: a stop that lands as the
    last batch commits must not make a run that finished look cut short.
    ``on_commit`` runs after each COMMIT, ``on_transient`` on
    each transient error before the reconnect. ``gaps`` tells the reader of retention's
    drops that took events after its cursor (:class:`GapWatch`), as it starts and while it
    runs; a caller that follows the same reader again in this process passes the same
    one, so a drop is told once. Each follow() makes its own otherwise.

    What ``handle`` raises is retried only when it is the database's doing
    (:func:`~ackline.sinks.connection.went_away`): a full disk under the handler's own
    output, or its failing statement, would fail the same batch again for ever, so it is
    raised. So is a connection lost after ``handle`` held the batch's transaction for
    ``idle_in_transaction_s`` (the server's ``idle_in_transaction_session_timeout`` on
    the connections ``connect`` makes) or longer: the server ends that session each time,
    and the batch would be handled again for ever (:class:`FeedError`, naming it).
    """
    wake = asyncio.Event()
    follower = _Follower(connect, wake, reader.name)
    remaining = limit
    cursor: Cursor | None = None
    cap = ReadCap(batch_events if batch_events is not None else reader.feed.max_events)
    held = _Held(reader.name)
    gaps = gaps if gaps is not None else GapWatch(reader.name, stored=reader.stored)
    try:
        while not stop.is_set():
            handler_failed = False
            began: float | None = None
            asked, cancels = _least(remaining, cap.size), reader.feed.cancelled
            try:
                conn = await follower.connection()
                if cursor is None or follower.fresh:
                    cursor = await _position(reader, conn, gaps, starting=cursor is None)
                    follower.fresh = False
                await gaps.look(conn, cursor)
                wake.clear()
                async with reader.next_batch(conn, asked) as batch:
                    began = time.monotonic()
                    try:
                        result = await handle(conn, batch)
                    except Exception as exc:
                        handler_failed = not went_away(exc, conn)
                        raise
            except Exception as exc:
                if handler_failed or not is_transient(exc, follower.current):
                    raise
                _retry_or_stop(reader.name, exc, began, idle_in_transaction_s)
                if reader.feed.cancelled > cancels:
                    _read_cancelled(reader.name, cap, asked, reader.feed.window, exc)
                if on_transient is not None:
                    on_transient(exc)
                await follower.backoff(exc, stop)
                continue
            follower.reset_backoff()
            cap.read(batch.progress)
            cursor = batch.end
            if on_commit is not None:
                on_commit(Committed(batch, result))
            if remaining is not None:
                remaining -= len(batch.events)
                if remaining <= 0:
                    on_end()  # before the close, which a stop may cut short
                    await gaps.last_look(conn, cursor)
                    break
            await held.seen(conn, batch.caught_up and batch.pending)
            if batch.caught_up:
                if not wait and not batch.pending:
                    on_end()
                    await gaps.last_look(conn, cursor)
                    break
                delay = min(0.05, poll_interval) if batch.pending else poll_interval
                await _sleep_until(delay, wake, stop)
    finally:
        await follower.close()
    return cursor if cursor is not None else START


async def _position(
    reader: AnyReader, conn: asyncpg.Connection, gaps: GapWatch, starting: bool
) -> Cursor:
    """The reader's cursor; as it starts, the drops after it told (:class:`GapWatch`)."""
    cursor = await reader.position(conn)
    if starting:
        await gaps.starting(conn, cursor)
    return cursor


class GapWatch:
    """Tells one reader, at WARNING, that retention dropped a partition holding events
    after its cursor (:mod:`~ackline.sinks.feed.gaps`): it reads on from the first batch
    the feed still holds, and nothing in what it reads says some were taken.

    As it starts (:meth:`starting`), every drop; then, while it runs, at most every
    :data:`GAP_LOOK_EVERY_S` between two reads and once more as a one-shot read ends
    (:meth:`look`), whether a drop was made since it last looked: one read of the newest
    ``drop_id``, and only when there is one, a read of the new drops. A reader running and
    behind when `retention --force` dropped what it had not read was told nothing. Each drop
    is told once (:class:`~ackline.sinks.feed.gaps.Told`). A look only: a read that fails is
    said and the reader goes on; a role that may not read ``retention_drops`` (or a
    database before migration 0014) is said once, and not looked at again."""

    def __init__(self, name: str, *, stored: bool) -> None:
        self.name = name
        self._stored = name if stored else None
        self._told = Told()
        self._looked = time.monotonic()
        self._blind = False

    async def starting(self, conn: asyncpg.Connection, cursor: Cursor) -> None:
        """Tell the drops after ``cursor``, the reader's as it starts. At INFO from the
        start: every `ackline tail` and every new processor starts where retention left
        the feed, unless this reader was stored already and a forced drop left it behind
        at the start."""
        if self._blind:
            return
        self._looked = time.monotonic()
        try:
            recorded = await drops(conn)
        except asyncpg.PostgresError as exc:
            self._cannot(exc, cursor)
            return
        here, lost = self._told.news(recorded, cursor)
        left_behind = any(self.name in d.readers_behind for d in lost)
        self._say(
            logging.INFO if here == START and not left_behind else logging.WARNING, here, lost
        )

    async def look(self, conn: asyncpg.Connection, cursor: Cursor, *, now: bool = False) -> None:
        """Tell a drop made since the last look that took events after the reader's
        cursor then, if :data:`GAP_LOOK_EVERY_S` passed since (``now``: whatever the time)."""
        if self._blind or (not now and time.monotonic() - self._looked < GAP_LOOK_EVERY_S):
            return
        self._looked = time.monotonic()
        try:
            newest = await newest_drop(conn)
            seen = self._told.seen
            recorded = await drops(conn, seen) if newest > seen else []
        except asyncpg.PostgresError as exc:
            if is_transient(exc, conn) and not isinstance(exc, asyncpg.QueryCanceledError):
                raise  # the connection's fault: the reader reconnects, and looks again
            self._cannot(exc, cursor)
            return
        here, lost = self._told.news(recorded, cursor, newest, self._stored)
        self._say(logging.WARNING, here, lost)

    async def last_look(self, conn: asyncpg.Connection, cursor: Cursor) -> None:
        """:meth:`look` as a one-shot read ends, whatever the time (it may have read past
        a drop since it last looked); a lost or timed-out connection is only that."""
        with contextlib.suppress(
            OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError
        ):
            async with asyncio.timeout(LAST_LOOK_S):  # no command_timeout on a feed's connection
                await self.look(conn, cursor, now=True)

    def _say(self, level: int, here: Cursor, lost: list[Drop]) -> None:
        if lost:
            log.log(
                level,
                "reader %s: retention dropped %d partition(s) holding events after cursor %s "
                "(the last %s): the feed no longer holds them, and this reader goes on from "
                "the first batch it still holds",
                self.name,
                len(lost),
                here.encode(),
                lost[-1].describe(),
            )

    def _cannot(self, exc: asyncpg.PostgresError, cursor: Cursor) -> None:
        """A read of ``retention_drops`` failed: said (no ackline schema: the read that
        follows says so, in one line); one that will fail again is not tried again."""
        self._blind = isinstance(
            exc,
            asyncpg.UndefinedTableError
            | asyncpg.UndefinedColumnError  # before migration 0014
            | asyncpg.InsufficientPrivilegeError,
        )
        if isinstance(exc, asyncpg.UndefinedTableError):
            return
        log.warning(
            "reader %s: could not tell whether retention dropped events after cursor %s (%s)",
            self.name,
            cursor.encode(),
            exc,
        )


class _Held:
    """Says, at WARNING, which transaction holds committed batches back from a reader
    that has waited on it :data:`HELD_WARN_AFTER_S` (the feed is read up to the oldest
    transaction still open in the cluster: a session idle in its transaction in another
    database holds every reader). A one-shot read (``ackline tail``, ``dispatch --once``)
    waited for it in silence."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._since: float | None = None
        self._said = 0.0

    async def seen(self, conn: asyncpg.Connection, held: bool) -> None:
        now = time.monotonic()
        if not held:
            self._since = None
            return
        if self._since is None:
            self._since = now
        if now - self._since < HELD_WARN_AFTER_S or now - self._said < HELD_WARN_EVERY_S:
            return
        self._said = now
        try:
            row = await conn.fetchrow(_HOLDER)
        except Exception as exc:  # only a look: a lost connection is the next read's to see
            row, why = None, f" (could not look: {exc})"
        else:
            why = " (not visible to this role: pg_read_all_stats shows it)"
        if row is None:
            log.warning(
                "reader %s: committed batches have waited %.0f s behind a transaction "
                "still open in this PostgreSQL cluster%s; they are read once it ends",
                self._name,
                now - self._since,
                why,
            )
            return
        log.warning(
            "reader %s: committed batches have waited %.0f s behind %s %s (database %s, "
            "%s, %s, open %s), the oldest open transaction this role can see in the cluster; "
            "they are read once it ends",
            self._name,
            now - self._since,
            row["kind"],
            row["id"],
            row["database"],
            row["name"] or "no application name",
            row["state"] or "state not visible to this role",
            "an unknown time" if row["open_s"] is None else f"{row['open_s']:.0f} s",
        )


class ReadCap:
    """How many events a read may ask for, after the server cancelled reads (the
    changefeed keeps one of these for the transactions a read spans, too).

    A read cancelled by the server (a ``statement_timeout`` shorter than one read, or a
    cancel) was retried at the same size for ever. Each cancelled read halves what it
    asked for; after :data:`GROW_AFTER` reads in a row that made progress (events, or
    transactions passed) the size
    doubles again, up to ``full``, so a slow moment does not shrink the reads for good.
    Pure: :func:`follow` feeds it what happened."""

    GROW_AFTER = 16

    def __init__(self, full: int) -> None:
        self.full = full
        self.size = full
        self._answered = 0

    def cancelled(self, asked: int | None) -> bool:
        """Halve what was ``asked`` (None: the full size); False when it was one event
        (nothing smaller to try)."""
        self._answered = 0
        asked = self.size if asked is None else min(asked, self.size)
        if asked <= 1:
            self.size = 1
            return False
        self.size = max(1, asked // 2)
        return True

    def read(self, progress: int) -> None:
        """A read answered, with ``progress`` events or transactions passed (one that
        passed nothing, at the head, proves nothing; one that passed transactions a filter
        emptied does: a filtered reader's reads stayed small for good)."""
        if self.size >= self.full or progress == 0:
            return
        self._answered += 1
        if self._answered >= self.GROW_AFTER:
            self._answered = 0
            self.size = min(self.full, self.size * 2)


def _retry_or_stop(
    name: str, exc: BaseException, began: float | None, idle_in_transaction_s: float | None
) -> None:
    """A transient error (``began``: when the handler got the batch, None if it did not):
    raise FeedError where retrying would repeat it for ever, else return (retry)."""
    held = None if began is None else time.monotonic() - began
    if held is not None and idle_in_transaction_s is not None and held >= idle_in_transaction_s:
        raise FeedError(
            f"reader {name}: the handler held the batch's transaction "
            f"{held:.1f} s, past the server's idle_in_transaction_session_timeout "
            f"({idle_in_transaction_s:g} s), and the connection was lost ({exc}): "
            "the same batch would be handled again for ever. Read smaller batches "
            "or raise ACKLINE_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS"
        ) from exc


def _read_cancelled(
    name: str, cap: ReadCap, asked: int | None, window: int, exc: BaseException
) -> None:
    """The server cancelled the feed's read: read fewer events next time. A read of one
    event cancelled too is retried as it is (a lock held on the feed's tables past the
    timeout ends some day; stopping the reader for good would not help), each time with
    an ERROR that names the setting."""
    if cap.cancelled(asked):
        log.warning(
            "reader %s: the server cancelled a read (%s): reading at most %d event(s) of at "
            "most %d transaction(s) a batch",
            name,
            exc,
            cap.size,
            window,
        )
        return
    log.error(
        "reader %s: the server cancelled the read of one event (%s): a statement_timeout "
        "this short (the role's or the database's), or a lock held on the feed's tables "
        "past it, stops every read; raise statement_timeout for the reader's role, or end "
        "what holds the lock. Retrying",
        name,
        exc,
    )


def _least(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def connector(
    dsn: str,
    application_name: str,
    bounds: Bounds | None = None,
    *,
    idle_in_transaction_timeout_ms: int | None = None,
) -> Callable[[], Awaitable[asyncpg.Connection]]:
    """A connect function for :func:`follow` (the readers of `ackline tail`, `process`
    and `dispatch`, and the processors' lag watch), whose connections are bounded as the
    worker's are (:mod:`ackline.sinks.connection`) but for their statements.

    - The connect by ``bounds.connect_s``.
    - The socket and the session by the worker's link bounds (:func:`bound_socket`,
      :func:`link_settings`, sized by ``bounds.statement_s``): a request that reached
      the server just before the link went dark, whose reply was lost and whose session
      the server then dropped, would leave the client waiting for ever (nothing of its
      own unacknowledged, nothing probing the peer); keepalives find that out, and
      TCP_USER_TIMEOUT a request or reply that goes unacknowledged. The server in turn
      ends a vanished client's session, so its cursor row lock (and every reader's
      horizon) is not held for ever: ``idle_in_transaction_session_timeout``
      (``bounds.idle_in_transaction_ms``) covers only a transaction left idle.
    - No ``command_timeout``: a feed read, and a processor's own statements, may rightly
      run long; a live server answers them in its own time.
    - No ``plan_cache_mode``: it is there for the worker's key read; a processor's
      statements are its own, and their plans its own concern.

    ``idle_in_transaction_timeout_ms``, the one bound this function took before
    ``bounds`` (docs/changefeed.md told a reader's code to pass it), still sets that one.
    """
    bounds = bounds or Bounds()
    if idle_in_transaction_timeout_ms is not None:
        bounds = dataclasses.replace(bounds, idle_in_transaction_ms=idle_in_transaction_timeout_ms)
    settings = {**link_settings(bounds), "application_name": application_name[:63]}

    async def connect() -> asyncpg.Connection:
        conn = await asyncpg.connect(dsn, timeout=bounds.connect_s, server_settings=settings)
        try:
            bound_socket(conn, bounds)
        except BaseException:
            drop(conn)
            raise
        return conn

    return connect


class _Follower:
    """The reader's own connection, LISTENing on :data:`CHANNEL`; reconnects on loss."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[asyncpg.Connection]],
        wake: asyncio.Event,
        name: str,
    ) -> None:
        self._connect = connect
        self._wake = wake
        self._name = name
        self.current: asyncpg.Connection | None = None
        self.fresh = True
        self._delay = 0.05
        self._said_at: float | None = None  # the outage's last WARNING

    def _notified(self, *_: Any) -> None:
        self._wake.set()

    async def connection(self) -> asyncpg.Connection:
        if self.current is None or self.current.is_closed():
            self.current = None
            conn = await self._connect()
            try:
                await conn.add_listener(CHANNEL, self._notified)
            except BaseException:
                conn.terminate()
                raise
            self.current = conn
            self.fresh = True
        return self.current

    async def backoff(self, exc: BaseException, stop: asyncio.Event) -> None:
        """Drop the connection and wait before the next try. One WARNING as an outage
        begins, then one a minute (:data:`RECONNECT_SAY_EVERY_S`; DEBUG between): a
        45 s outage logged 15 of them besides the ERROR the connect's retries give."""
        now = time.monotonic()
        if self._said_at is None or now - self._said_at >= RECONNECT_SAY_EVERY_S:
            self._said_at = now
            log.warning("reader %s: transient error, reconnecting: %s", self._name, exc)
        else:
            log.debug("reader %s: transient error, reconnecting: %s", self._name, exc)
        await self.close()
        await _sleep_until(self._delay * (0.5 + random.random()), asyncio.Event(), stop)
        self._delay = min(self._delay * 2, 5.0)

    def reset_backoff(self) -> None:
        self._delay = 0.05
        self._said_at = None

    async def close(self) -> None:
        conn, self.current = self.current, None
        if conn is None or conn.is_closed():
            return
        try:
            async with asyncio.timeout(5):
                await conn.close()
        except Exception:
            conn.terminate()


async def _sleep_until(seconds: float, *events: asyncio.Event) -> None:
    """Sleep ``seconds`` or until any of ``events`` is set, whichever comes first."""
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
