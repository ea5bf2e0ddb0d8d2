"""Follow ingested rows exactly once: the changefeed reader (docs/changefeed.md).

The contract, in the database's terms:

* every ingest batch row carries ``commit_xid``, the xid8 of the transaction that wrote
  it (a column default evaluated inside the batch's transaction);
* a read is ONE statement, so one snapshot; it takes the snapshot's horizon
  ``xmin = pg_snapshot_xmin(pg_current_snapshot())`` and reads only batches whose
  ``commit_xid < xmin``, in xid order, after the reader's cursor. Every transaction
  below ``xmin`` has ended (committed and visible to this snapshot, or rolled back), and
  every xid assigned after the snapshot is >= its xmax >= xmin: the set of batches below
  ``xmin`` can never grow. So a cursor below ``xmin`` never has a batch appear behind it
  — a reader cannot skip, whatever order the writers commit in;
* the read runs before the reader's transaction holds an xid of its own (checked: an own
  xid would pin ``xmin`` to itself and stall every reader behind this transaction);
* an erasure (``erasures``, :mod:`ackline.sinks.admin.erase`) is a transaction of the
  feed too, ordered by its own ``commit_xid``: it delivers one ``ackline.erased`` notice
  (``FeedEvent.erasure_id`` set, keys only) per event it erased, to every reader whatever
  its filter. A reader that had not yet read the erased events finds them missing from
  their batch and meets the notice before or after it (an erasure whose xid is older
  than the batch's can delete the batch's rows once it has committed); none ever reads
  erased content;
* a named reader's cursor row (``feed_cursors``) is advanced by compare-and-set on its
  version, in the same transaction as the reader's side effects: both commit or neither,
  so a reader that keeps its side effects in PostgreSQL never sees a row twice. Two
  instances of one reader may race; the loser's update finds the version moved, rolls
  back before any side effect, and reads again from the winner's cursor.

Writers ``pg_notify('ackline_batches', batch_id)`` inside the batch transaction (delivered
on COMMIT only); :func:`ackline.sinks.feed.follow.follow` LISTENs to wake at once and
polls as a fallback
(a notified batch may still sit above ``xmin`` behind an older open transaction, which
sends nothing when it ends).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import asyncpg

from ackline.core.faults import DISARMED, Faults
from ackline.sinks.errors import FeedError
from ackline.sinks.feed.follow import (
    CHANNEL,
    AnyReader,
    Committed,
    Handler,
    ReadCap,
    connector,
    follow,
)
from ackline.sinks.feed.types import (
    ALL,
    MAX_BYTES,
    START,
    Cursor,
    FeedBatch,
    FeedEvent,
    Filter,
    erasure_notices,
    passed,
    stored_cursor,
    window_end,
)

__all__ = [
    "CHANNEL",
    "AnyReader",
    "Changefeed",
    "Committed",
    "Handler",
    "LocalReader",
    "Reader",
    "ReaderStats",
    "connector",
    "follow",
    "saved_cursor",
]

_READ = """
WITH horizon AS (
    SELECT pg_snapshot_xmin(s.snap) AS xmin, pg_snapshot_xmax(s.snap) AS xmax,
           pg_current_xact_id_if_assigned() AS own_xid
    FROM pg_current_snapshot() AS s(snap)
), txs AS (
    SELECT x.commit_xid FROM (
        (SELECT DISTINCT b.commit_xid
         FROM ingest_batches AS b, horizon AS h
         WHERE b.commit_xid < h.xmin AND b.commit_xid >= $1::xid8
           AND (b.commit_xid > $1::xid8 OR $2::bigint IS NOT NULL)
         ORDER BY b.commit_xid
         LIMIT $3)
        UNION
        (SELECT DISTINCT e.commit_xid
         FROM erasures AS e, horizon AS h
         WHERE e.commit_xid < h.xmin AND e.commit_xid >= $1::xid8
           AND (e.commit_xid > $1::xid8 OR $2::bigint IS NOT NULL)
         ORDER BY e.commit_xid
         LIMIT $3)
    ) AS x
    ORDER BY x.commit_xid
    LIMIT $3
), bound AS (
    SELECT (SELECT max(commit_xid) FROM txs) AS upper,
           -- the window's xids (at most $3): a read cut inside the window passed only
           -- those below where it ends (types.passed)
           (SELECT array_agg(commit_xid::text::bigint ORDER BY commit_xid) FROM txs) AS xids,
           h.own_xid,
           EXISTS (SELECT 1 FROM ingest_batches AS p WHERE p.commit_xid >= h.xmin)
           OR EXISTS (SELECT 1 FROM erasures AS p WHERE p.commit_xid >= h.xmin) AS pending,
           -- xids of another cluster (copied by pg_dump or logical replication): no xid
           -- of this one that a row or a cursor can hold is at or above xmax
           $1::xid8 >= h.xmax
           OR EXISTS (SELECT 1 FROM ingest_batches AS f WHERE f.commit_xid >= h.xmax)
           OR EXISTS (SELECT 1 FROM erasures AS f WHERE f.commit_xid >= h.xmax) AS foreign,
           h.xmax
    FROM horizon AS h
), ev AS (
    -- keys only: the window sorted here may span 64 transactions, and a read cut by bytes
    -- returns a small part of it (the payloads are fetched below for the rows kept)
    SELECT u.* FROM (
        SELECT b.commit_xid, a.event_id, a.txn_id, a.type, a.agent_id, a.request_id,
               a.occurred_at, a.schema_version, a.ingested_on, a.batch_id,
               a.src_topic, a.src_partition, a.src_offset, NULL::bigint AS erasure_id
        FROM txs
        JOIN ingest_batches AS b ON b.commit_xid = txs.commit_xid
        JOIN activity AS a ON a.batch_id = b.batch_id
        WHERE ($2::bigint IS NULL OR b.commit_xid > $1::xid8
               OR (a.batch_id, a.src_partition, a.src_offset, a.src_topic COLLATE "C")
                  > ($2::bigint, $4::int, $5::bigint, $6::text COLLATE "C"))
          AND ($7::text[] IS NULL OR a.type = ANY($7::text[]))
          AND ($8::text[] IS NULL OR a.agent_id = ANY($8::text[]))
        UNION ALL
        -- An erasure is a transaction of the feed of its own: one notice per erased
        -- event, at the erased event's coordinates, whatever the filter (keys only).
        SELECT e.commit_xid, t.event_id, t.txn_id, 'ackline.erased', '', '',
               e.erased_at, 0, NULL, t.batch_id,
               t.src_topic, t.src_partition, t.src_offset, e.erasure_id
        FROM txs
        JOIN erasures AS e ON e.commit_xid = txs.commit_xid
        JOIN erased_events AS t ON t.erasure_id = e.erasure_id
        WHERE ($2::bigint IS NULL OR e.commit_xid > $1::xid8
               OR (t.batch_id, t.src_partition, t.src_offset, t.src_topic COLLATE "C")
                  > ($2::bigint, $4::int, $5::bigint, $6::text COLLATE "C"))
    ) AS u
    ORDER BY u.commit_xid, u.batch_id, u.src_partition, u.src_offset, u.src_topic COLLATE "C"
    LIMIT $9::bigint
), sized AS (
    -- payload bytes (JSON text) of the events before each one (before), and before the
    -- one before it (shown): rows go out while what came before the previous row is under
    -- $10, each with its payload while what came before it is: the read holds at most
    -- $10 bytes of payloads and the one that passes them, and one row more without a
    -- payload, which says the window was cut; the first event always goes, however large
    SELECT ev.*,
           coalesce(sum(s.bytes) OVER (
               ORDER BY ev.commit_xid, ev.batch_id, ev.src_partition, ev.src_offset,
                        ev.src_topic COLLATE "C"
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before,
           coalesce(sum(s.bytes) OVER (
               ORDER BY ev.commit_xid, ev.batch_id, ev.src_partition, ev.src_offset,
                        ev.src_topic COLLATE "C"
               ROWS BETWEEN UNBOUNDED PRECEDING AND 2 PRECEDING), 0) AS shown
    FROM ev
    LEFT JOIN LATERAL (
        SELECT octet_length(a.payload::text) AS bytes
        FROM activity AS a
        WHERE ev.erasure_id IS NULL AND a.ingested_on = ev.ingested_on
          AND a.batch_id = ev.batch_id AND a.src_partition = ev.src_partition
          AND a.src_offset = ev.src_offset AND a.src_topic = ev.src_topic
    ) AS s ON true
)
SELECT bound.upper, bound.xids, bound.own_xid, bound.pending, bound.foreign, bound.xmax,
       sized.*, p.payload
FROM bound
LEFT JOIN sized ON sized.shown < $10::bigint
LEFT JOIN LATERAL (
    SELECT a.payload::text AS payload
    FROM activity AS a
    WHERE sized.erasure_id IS NULL AND sized.before < $10::bigint
      AND a.ingested_on = sized.ingested_on AND a.batch_id = sized.batch_id
      AND a.src_partition = sized.src_partition AND a.src_offset = sized.src_offset
      AND a.src_topic = sized.src_topic
) AS p ON true
ORDER BY sized.commit_xid, sized.batch_id, sized.src_partition, sized.src_offset,
         sized.src_topic COLLATE "C"
"""

_ENSURE = """
INSERT INTO feed_cursors (reader, position, within_batch, within_partition, within_offset,
                          within_topic)
VALUES ($1, $2::xid8, $3, $4, $5, $6)
ON CONFLICT (reader) DO NOTHING
"""

_CURSOR = """
SELECT position, within_batch, within_partition, within_offset, within_topic, version
FROM feed_cursors WHERE reader = $1
"""

_ADVANCE = """
UPDATE feed_cursors
SET position = $3::xid8, within_batch = $4, within_partition = $5, within_offset = $6,
    within_topic = $7, version = version + 1, transactions = transactions + $8,
    delivered = delivered + $9, erased = erased + $10, updated_at = now()
WHERE reader = $1 AND version = $2
"""


ANY_COUNT = 2**62
"""No bound from :func:`fits_next` (the caller's and max_events still apply)."""


class Changefeed:
    """Reads the feed from any cursor; holds no connection, and no state but a count of
    its reads the server cancelled (``cancelled``: :func:`follow` reads less after one)
    and how many events fitted in ``max_bytes`` lately (:func:`fits_next`): give each
    follow() loop a Changefeed of its own."""

    def __init__(
        self,
        filter: Filter = ALL,
        *,
        max_transactions: int = 64,
        max_events: int = 5_000,
        max_bytes: int = MAX_BYTES,
    ) -> None:
        if max_transactions < 1:
            raise FeedError(f"max_transactions must be at least 1, not {max_transactions}")
        if max_events < 1:
            raise FeedError(f"max_events must be at least 1, not {max_events}")
        if max_bytes < 1:
            raise FeedError(f"max_bytes must be at least 1, not {max_bytes}")
        self.filter = filter
        self.max_transactions = max_transactions
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.cancelled = 0
        self._fits = ANY_COUNT  # see fits_next
        # The transactions a read spans: the statement sorts the keys of all their events
        # before it cuts at the events asked for, so a read cancelled by a statement_timeout
        # shorter than that sort was cancelled again at any smaller count of events. Each
        # cancel halves the window too, and it grows back as the events' cap does.
        self._window = ReadCap(max_transactions)

    @property
    def window(self) -> int:
        """The transactions the next read spans at most (``max_transactions`` until the
        server cancels reads)."""
        return self._window.size

    async def read(
        self, conn: asyncpg.Connection, cursor: Cursor, limit: int | None = None
    ) -> FeedBatch:
        """The events after ``cursor``, at most :attr:`window` whole transactions
        (cut after ``limit`` events, else after ``max_events``, in the statement: a cut
        read fetches ``limit + 1`` rows, not the whole window), in feed order; cut too
        once the events' payloads pass ``max_bytes`` (the first event is read whatever its
        size). One statement, one snapshot. Without a cut, one read of a large
        transaction (an erasure of a busy agent: millions of notices) held it all in
        memory, and 5,000 payloads of 1 MB each held gigabytes.

        Raises :class:`FeedError` if ``conn``'s transaction already holds an xid (that
        xid would hold this snapshot's horizon at itself), or if the cursor or a batch
        holds an xid this cluster has not reached (the database was copied from another
        cluster, or an in-memory cursor outlived an asynchronous failover: new batches
        would sort before the cursor, and be skipped).
        """
        w = cursor.within
        types, agents = self.filter.sql_args()
        if limit is None:
            limit = self.max_events
        asked, limit = limit, min(limit, self._fits)
        try:
            rows = await conn.fetch(
                _READ,
                cursor.xid,
                None if w is None else w.batch_id,
                self._window.size,
                None if w is None else w.partition,
                None if w is None else w.offset,
                None if w is None else w.topic,
                types,
                agents,
                limit + 1,  # one more says whether the window was cut
                self.max_bytes,
            )
        except asyncpg.exceptions.QueryCanceledError:
            self.cancelled += 1  # statement_timeout, or a cancel: this read's, not a lock's
            self._window.cancelled(None)
            raise
        head = rows[0]
        if head["foreign"]:
            raise FeedError(
                f"the feed holds transaction ids this PostgreSQL cluster has not reached "
                f"(its next is {head['xmax']}; the cursor is at {cursor.xid}, or a batch "
                "is above it): the database was copied into another cluster (pg_dump and "
                "restore, logical replication), whose ids start over, or this cursor, not "
                "stored in the database, was read on a primary that an asynchronous "
                "failover lost. Read on, the batches given those ids again would sort "
                'before the cursor and be skipped. See docs/changefeed.md, "Moving the '
                'database to another cluster" and "Across a database failover"'
            )
        if head["own_xid"] is not None:
            raise FeedError(
                "the feed was read in a transaction that holds an xid "
                f"({head['own_xid']}); read it first, before any write"
            )
        events = [_event(r) for r in rows if r["event_id"] is not None]
        upper = None if head["upper"] is None else int(head["upper"])
        within = sum(1 for r in rows if r["event_id"] is not None and r["before"] < self.max_bytes)
        bytes_cut = 0 < within < len(events)
        kept, end = window_end(cursor, upper, events, within if bytes_cut else limit)
        self._fits = fits_next(self._fits, len(kept), bytes_cut, limit < asked, asked)
        batch = FeedBatch(
            start=cursor,
            end=end,
            events=kept,
            transactions=passed(head["xids"] or [], end),
            pending=bool(head["pending"]),
        )
        self._window.read(batch.progress)
        return batch


def fits_next(fits: int, kept: int, bytes_cut: bool, shortened: bool, most: int) -> int:
    """How many events the next read asks for, at most (pure).

    The statement sizes every row it may return before it cuts at the byte bound, and
    sizing one is reading its payload's JSON text: a read of 5,000 payloads of 100 kB cut
    at 8 MiB read 500 MB to return 80 of them, again at every read. So after a cut by
    bytes the next read asks for twice what fitted; a read that the smaller ask cut
    (``shortened``: every event it asked for came) doubles it back, and past ``most``
    (what the caller asked for) lifts it."""
    if bytes_cut:
        return max(1, 2 * kept)
    if shortened and kept >= fits:
        return ANY_COUNT if 2 * fits >= most else 2 * fits
    return fits


def _event(r: asyncpg.Record) -> FeedEvent:
    return FeedEvent(
        event_id=r["event_id"],
        txn_id=r["txn_id"],
        type=r["type"],
        agent_id=r["agent_id"],
        request_id=r["request_id"],
        occurred_at=r["occurred_at"],
        schema_version=int(r["schema_version"]),
        payload={} if r["payload"] is None else json.loads(r["payload"]),
        batch_id=int(r["batch_id"]),
        commit_xid=int(r["commit_xid"]),
        topic=r["src_topic"],
        partition=int(r["src_partition"]),
        offset=int(r["src_offset"]),
        erasure_id=None if r["erasure_id"] is None else int(r["erasure_id"]),
    )


async def saved_cursor(conn: asyncpg.Connection, reader: str) -> Cursor | None:
    """A reader's stored cursor, or None if there is no such reader (creates nothing)."""
    row = await conn.fetchrow(_CURSOR, reader)
    return None if row is None else stored_cursor(row)


class _RaceLost(Exception):
    """Another instance of the reader advanced the cursor first."""


@dataclass
class ReaderStats:
    """Counted after COMMIT only."""

    transactions: int = 0
    delivered: int = 0
    lost_races: int = 0


class Reader:
    """A named reader whose cursor lives in ``feed_cursors``, next to its side effects."""

    stored = True  # a forced retention drop names it when it leaves it behind

    def __init__(
        self,
        name: str,
        feed: Changefeed | None = None,
        *,
        start: Cursor = START,
        faults: Faults = DISARMED,
    ) -> None:
        if not name:
            raise FeedError("a reader needs a name")
        self.name = name
        self.feed = feed or Changefeed()
        self.start = start
        self.stats = ReaderStats()
        self._faults = faults

    async def position(self, conn: asyncpg.Connection) -> Cursor:
        """The stored cursor; a reader seen for the first time is created at ``start``
        (autocommitted: an empty row consumes nothing)."""
        row = await conn.fetchrow(_CURSOR, self.name)
        if row is None:
            w = self.start.within
            try:
                await conn.execute(
                    _ENSURE,
                    self.name,
                    self.start.xid,
                    *((None,) * 4 if w is None else (w.batch_id, w.partition, w.offset, w.topic)),
                )
            except asyncpg.InsufficientPrivilegeError as exc:
                raise FeedError(
                    f"reader {self.name!r}: this role may not write feed_cursors "
                    "(a stored cursor needs INSERT and UPDATE on it)"
                ) from exc
            row = await conn.fetchrow(_CURSOR, self.name)
            if row is None:
                raise FeedError(f"reader {self.name!r} vanished while it was being created")
        return stored_cursor(row)

    @asynccontextmanager
    async def next_batch(
        self, conn: asyncpg.Connection, limit: int | None = None
    ) -> AsyncIterator[FeedBatch]:
        """Open a transaction holding the next batch of events and the advanced cursor.

        Order of effects: BEGIN (read committed); read the cursor row; read the feed
        (one statement, no xid held yet); compare-and-set the cursor row to the batch's
        end (this takes the row lock and the transaction's xid; a lost race rolls back
        and starts over); yield — the body makes its side effects on ``conn``; COMMIT.
        An exception in the body, or a crash anywhere before COMMIT, rolls back the
        cursor and the side effects together: the same batch is delivered again. A
        crash during COMMIT leaves the outcome to the database; the next call re-reads
        the cursor and continues from whatever committed. A caught-up reader's
        transaction changes nothing.
        """
        if conn.is_in_transaction():
            raise FeedError("next_batch needs a connection that is not in a transaction")
        while True:
            tr = conn.transaction(isolation="read_committed")
            await tr.start()
            try:
                batch = await self._claim(conn, limit)
            except _RaceLost:
                await tr.rollback()
                self.stats.lost_races += 1
                continue
            except BaseException:
                await _rollback_quietly(conn, tr)
                raise
            break
        try:
            yield batch
            if not batch.caught_up:  # a read cut inside a transaction passes none
                await self._faults.ahit("feed_before_commit")
            if batch.end != batch.start:
                await self._still_open(conn)
        except BaseException:
            await _rollback_quietly(conn, tr)
            raise
        await tr.commit()
        self.stats.transactions += batch.transactions
        self.stats.delivered += len(batch.events)

    async def _still_open(self, conn: asyncpg.Connection) -> None:
        """Raise FeedError if the batch's transaction is aborted: a statement of the body
        failed and the body caught the error. PostgreSQL answers COMMIT of an aborted
        transaction with ROLLBACK, not an error, so the batch (side effects and cursor)
        would be rolled back while next_batch returned as if it had committed, and the
        same batch would come again for ever. Any statement fails in an aborted
        transaction; this one reads the cursor the batch moved."""
        try:
            await conn.fetchrow(_CURSOR, self.name)
        except asyncpg.InFailedSQLTransactionError as exc:
            raise FeedError(
                f"reader {self.name!r}: a statement of the batch's transaction failed and "
                "the handler went on, so the transaction is aborted: its side effects and "
                "the cursor are rolled back and the batch comes again. Let the error out "
                "of the handler, or catch it inside a savepoint (async with "
                "conn.transaction())"
            ) from exc

    async def _claim(self, conn: asyncpg.Connection, limit: int | None) -> FeedBatch:
        row = await conn.fetchrow(_CURSOR, self.name)
        if row is None:
            raise FeedError(f"reader {self.name!r} has no cursor row; call position() first")
        batch = await self.feed.read(conn, stored_cursor(row), limit)
        if batch.end == batch.start:
            return batch
        w = batch.end.within
        try:
            status = await conn.execute(
                _ADVANCE,
                self.name,
                row["version"],
                batch.end.xid,
                *((None,) * 4 if w is None else (w.batch_id, w.partition, w.offset, w.topic)),
                batch.transactions,
                len(batch.events),
                erasure_notices(batch.events),
            )
        except asyncpg.UndefinedColumnError as exc:
            raise FeedError(
                f"reader {self.name!r}: feed_cursors.erased is missing ({exc}); run `ackline "
                "migrate` (0013_feed_cursor_erased.sql) before starting readers of this version"
            ) from exc
        if status != "UPDATE 1":
            raise _RaceLost()
        return batch


class LocalReader:
    """A reader whose cursor lives only in memory: a read-only view of the feed.

    Nothing is written to the database; :meth:`next_batch` reads in autocommit and moves
    the in-memory cursor once the body returns. Use it to inspect the feed (`ackline
    tail` without ``--commit``); resuming is the caller's business (print the cursor).
    """

    stored = False

    def __init__(self, feed: Changefeed | None = None, *, start: Cursor = START) -> None:
        self.name = "(local)"
        self.feed = feed or Changefeed()
        self.cursor = start
        self.stats = ReaderStats()

    async def position(self, conn: asyncpg.Connection) -> Cursor:
        return self.cursor

    @asynccontextmanager
    async def next_batch(
        self, conn: asyncpg.Connection, limit: int | None = None
    ) -> AsyncIterator[FeedBatch]:
        """Read after the in-memory cursor; advance it only if the body returns."""
        batch = await self.feed.read(conn, self.cursor, limit)
        yield batch
        self.cursor = batch.end
        self.stats.transactions += batch.transactions
        self.stats.delivered += len(batch.events)


async def _rollback_quietly(conn: asyncpg.Connection, tr: Any) -> None:
    if conn.is_closed():
        return
    with contextlib.suppress(asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
        await tr.rollback()
