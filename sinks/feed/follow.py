"""The follow loop of a changefeed reader: LISTEN, read, handle, commit, wait.

A reader is anything with ``position(conn)`` and ``next_batch(conn, limit)`` (an async
context manager yielding a :class:`~ackline.sinks.feed.types.FeedBatch`): the stored
:class:`ackline.sinks.feed.changefeed.Reader` or the in-memory
:class:`ackline.sinks.feed.changefeed.LocalReader`.
The loop owns one connection, LISTENs on :data:`CHANNEL` (writers notify inside each
batch transaction; PostgreSQL delivers on COMMIT only) and falls back to polling.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import asyncpg

from ackline.sinks.connection import is_transient, went_away
from ackline.sinks.errors import FeedError
from ackline.sinks.feed.types import START, Cursor, FeedBatch

log = logging.getLogger(__name__)
T = TypeVar("T")

CHANNEL = "ackline_batches"
"""The writer's ``pg_notify`` channel (ackline.sinks.ingest.writer); the payload is the batch id."""


Handler = Callable[[asyncpg.Connection, FeedBatch], Awaitable[T]]


@dataclass(frozen=True, slots=True)
class Committed(Generic[T]):
    """A batch whose cursor update committed, with what the handler returned."""

    batch: FeedBatch
    result: T


class AnyReader(Protocol):
    name: str

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
    confirmed commits only). ``on_commit`` runs after each COMMIT, ``on_transient`` on
    each transient error before the reconnect.

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
    try:
        while not stop.is_set():
            handler_failed = False
            began: float | None = None
            try:
                conn = await follower.connection()
                if cursor is None or follower.fresh:
                    cursor = await reader.position(conn)
                    follower.fresh = False
                wake.clear()
                async with reader.next_batch(conn, _least(remaining, batch_events)) as batch:
                    began = time.monotonic()
                    try:
                        result = await handle(conn, batch)
                    except Exception as exc:
                        handler_failed = not went_away(exc, conn)
                        raise
            except Exception as exc:
                if handler_failed or not is_transient(exc, follower.current):
                    raise
                held = None if began is None else time.monotonic() - began
                if (
                    held is not None
                    and idle_in_transaction_s is not None
                    and held >= idle_in_transaction_s
                ):
                    raise FeedError(
                        f"reader {reader.name}: the handler held the batch's transaction "
                        f"{held:.1f} s, past the server's idle_in_transaction_session_timeout "
                        f"({idle_in_transaction_s:g} s), and the connection was lost ({exc}): "
                        "the same batch would be handled again for ever. Read smaller batches "
                        "or raise ACKLINE_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS"
                    ) from exc
                if on_transient is not None:
                    on_transient(exc)
                await follower.backoff(exc, stop)
                continue
            follower.reset_backoff()
            cursor = batch.end
            if on_commit is not None:
                on_commit(Committed(batch, result))
            if remaining is not None:
                remaining -= len(batch.events)
                if remaining <= 0:
                    break
            if batch.caught_up:
                if not wait and not batch.pending:
                    break
                delay = min(0.05, poll_interval) if batch.pending else poll_interval
                await _sleep_until(delay, wake, stop)
    finally:
        await follower.close()
    return cursor if cursor is not None else START


def _least(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def connector(
    dsn: str, application_name: str, *, idle_in_transaction_timeout_ms: int = 15_000
) -> Callable[[], Awaitable[asyncpg.Connection]]:
    """A connect function for :func:`follow`: a stalled reader must not hold its cursor
    row lock (nor pin every reader's horizon) forever."""

    async def connect() -> asyncpg.Connection:
        return await asyncpg.connect(
            dsn,
            timeout=10,
            server_settings={
                "application_name": application_name[:63],
                "idle_in_transaction_session_timeout": str(idle_in_transaction_timeout_ms),
            },
        )

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
        log.warning("reader %s: transient error, reconnecting: %s", self._name, exc)
        await self.close()
        await _sleep_until(self._delay * (0.5 + random.random()), asyncio.Event(), stop)
        self._delay = min(self._delay * 2, 5.0)

    def reset_backoff(self) -> None:
        self._delay = 0.05

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
