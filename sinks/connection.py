"""One PostgreSQL connection that reconnects, bounds every wait, and the rule for what is
transient.

A PostgreSQL host can vanish without a reset (a crash, a failover, a firewall that starts
dropping): then nothing ever answers and nothing is ever closed, in either direction, and a
wait without a bound lasts for ever. So every wait here has one (:class:`Bounds`):

- the connect (TCP, TLS, startup, and the answer to the connection's first read) is
  bounded by ``connect_s`` (the read by at least a second);
- every statement by asyncpg's ``command_timeout`` (``statement_s``), which also bounds
  asyncpg's own CancelRequest after a timeout (without it a cancel that never gets an
  answer would leave ``close()`` waiting for ever); the writer bounds COMMIT apart
  (``commit_s``);
- the client socket gets TCP keepalives and ``TCP_USER_TIMEOUT``, so a dead connection
  fails by itself even between statements;
- the server session gets the same keepalives, ``tcp_user_timeout`` and
  ``client_connection_check_interval`` in the startup packet, so the *server* ends the
  session of a client that vanished (and frees its row locks) instead of waiting for
  ever: ``idle_in_transaction_session_timeout`` covers only an idle transaction, not a
  backend waiting in COPY or running a statement. The changefeed's connections (its
  readers, the processors and their lag watch) get these two, :func:`link_settings` and
  :func:`bound_socket`, and not the statement bound: a feed read or a processor's
  statement may rightly run long;
- a connection given up on is never closed politely (that waits on the dead peer): it is
  terminated at once, with SO_LINGER=0 so that a COMMIT still queued in our kernel is
  dropped rather than delivered if the path heals. Its server session may live on for a
  while and hold locks, so the next connection ends it first (``pg_terminate_backend``,
  matched on pid *and* backend start, which a role may do to its own sessions): after
  that nothing it sent can still commit.

Failures are counted per :class:`Database` until the next success: WARNING lines while
the outage is younger than ``down_error_after_s``, then one ERROR line (repeated once per
``down_error_after_s``), and ``on_down`` tells readiness since when it has been failing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import asyncpg

from ackline.sinks.errors import RETRY_MAX_BACKOFF_S, TransientDatabaseError, WaitStoppedError

log = logging.getLogger(__name__)
T = TypeVar("T")

_TRANSIENT: tuple[type[BaseException], ...] = (
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,  # admin shutdown, crash, cannot connect now
    asyncpg.exceptions.TransactionRollbackError,  # serialization failure, deadlock
    asyncpg.exceptions.InsufficientResourcesError,  # too many connections, disk full
    asyncpg.exceptions.ConnectionDoesNotExistError,
    asyncpg.exceptions.InternalClientError,
    asyncpg.exceptions.QueryCanceledError,  # a statement or lock timeout of ours
    asyncpg.exceptions.LockNotAvailableError,  # lock_timeout
    # A node that came back as a standby (after a failover): a new connection through a
    # multi-host DSN with target_session_attrs=read-write finds the primary.
    asyncpg.exceptions.ReadOnlySQLTransactionError,
    OSError,
    TimeoutError,
)

_STOP_POLL_S = 0.1

_END_OLD_SESSION = """
SELECT count(*) AS found, coalesce(bool_and(pg_terminate_backend(pid, $3::bigint)), true) AS gone
FROM pg_stat_activity WHERE pid = $1 AND backend_start = $2
"""

_BACKEND_START = "SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()"


def describe(exc: BaseException) -> str:
    """One line for an error: asyncpg's TimeoutError and some OSErrors have no message."""
    text = str(exc).strip()
    name = type(exc).__name__
    if not text:
        return f"{name} (no answer in time)" if isinstance(exc, TimeoutError) else name
    return text if isinstance(exc, TransientDatabaseError) else f"{name}: {text}"


def is_transient(exc: BaseException, conn: asyncpg.Connection | None = None) -> bool:
    """True when retrying (on a fresh connection if need be) may succeed."""
    if isinstance(exc, _TRANSIENT):
        return True
    return isinstance(exc, asyncpg.InterfaceError) and (conn is None or conn.is_closed())


def went_away(exc: BaseException, conn: asyncpg.Connection) -> bool:
    """Whether ``exc``, raised by code of the caller's own on ``conn`` (a processor's
    ``apply``, a changefeed handler), is the database's doing (retry the batch on a new
    connection) rather than that code's (stop: the same batch would fail the same way).

    Stricter than :func:`is_transient`: an OSError or TimeoutError counts only when the
    connection is closed (the caller's code raises them too: a missing file, a full
    disk, a socket of its own), and a cancelled statement (``statement_timeout``) is
    the batch's failure, not the database's.
    """
    if isinstance(exc, asyncpg.exceptions.QueryCanceledError):
        return False
    if isinstance(exc, (OSError, TimeoutError)):
        return conn.is_closed()
    return is_transient(exc, conn)


@dataclass(frozen=True, slots=True)
class Bounds:
    """Every bound of a :class:`Database`'s waits, in seconds unless named ``_ms``."""

    connect_s: float = 10.0
    statement_s: float = 30.0
    commit_s: float = 30.0
    idle_in_transaction_ms: int = 15_000
    down_error_after_s: float = 60.0

    @property
    def keepalive(self) -> tuple[int, int, int]:
        """(idle, interval, count) in whole seconds: an idle dead connection is found
        after about idle + count * interval, two thirds of ``statement_s``."""
        idle = min(60, max(1, round(self.statement_s / 3)))
        interval = min(20, max(1, round(idle / 3)))
        return idle, interval, 3

    @property
    def user_timeout_ms(self) -> int:
        """TCP_USER_TIMEOUT: data unacknowledged this long means the peer is gone."""
        return max(1000, int(self.statement_s * 1000))

    @property
    def terminate_wait_ms(self) -> int:
        """How long ending an old session may wait for it to go (below command_timeout)."""
        return max(100, int(self.statement_s * 1000 / 2))


def link_settings(bounds: Bounds) -> dict[str, str]:
    """The server settings (all of context ``user``, sent in the startup packet) that
    make the server end the session of a client that vanished, instead of keeping it,
    its locks and its transaction, for ever.

    Keepalives end it while nothing is in flight, ``tcp_user_timeout`` while the
    server's own reply goes unacknowledged, ``client_connection_check_interval``
    notices the dead socket during a statement, and
    ``idle_in_transaction_session_timeout`` ends a transaction its client stopped
    using (a stalled worker or reader must not hold its row locks for ever).
    """
    idle, interval, count = bounds.keepalive
    return {
        "idle_in_transaction_session_timeout": str(bounds.idle_in_transaction_ms),
        "tcp_keepalives_idle": str(idle),
        "tcp_keepalives_interval": str(interval),
        "tcp_keepalives_count": str(count),
        "tcp_user_timeout": str(bounds.user_timeout_ms),
        "client_connection_check_interval": str(interval * 1000),
    }


def session_settings(bounds: Bounds, application_name: str) -> dict[str, str]:
    """The worker's server settings: :func:`link_settings`, its name, and its plan cache.

    ``plan_cache_mode``: every statement is planned for its own parameters. After five
    runs PostgreSQL may otherwise cache a generic plan made from the statistics of that
    moment: the key read, planned while a just-migrated ledger was analyzed empty, kept a
    sequential scan and read the whole growing ledger for every batch (0.17 s, then 1.27
    s per batch ten seconds later) until autovacuum analyzed it again. Planning costs well
    under a millisecond per statement, and each statement serves a whole batch.
    """
    return {
        **link_settings(bounds),
        "application_name": application_name,
        "plan_cache_mode": "force_custom_plan",
    }


def _socket(conn: asyncpg.Connection) -> Any:
    """The connection's socket, or None. asyncpg has no public way to set socket options;
    its transport's ``socket`` extra accepts setsockopt, and the options take effect."""
    transport = getattr(conn, "_transport", None)
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None  # a unix socket: no network to lose
    return sock


def bound_socket(conn: asyncpg.Connection, bounds: Bounds) -> None:
    """Keepalive and TCP_USER_TIMEOUT on the client socket (Linux option names): a
    connection whose server vanished, or dropped the session while the link was down,
    fails by itself, even while the client waits for a reply it already asked for."""
    sock = _socket(conn)
    if sock is None:
        return
    idle, interval, count = bounds.keepalive
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (
        ("TCP_KEEPIDLE", idle),
        ("TCP_KEEPINTVL", interval),
        ("TCP_KEEPCNT", count),
        ("TCP_USER_TIMEOUT", bounds.user_timeout_ms),
    ):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


def drop(conn: asyncpg.Connection) -> None:
    """Terminate ``conn`` now, never waiting. SO_LINGER=0 makes the kernel throw away what
    is still queued (a COMMIT the server never acknowledged) instead of delivering it if
    the path heals after we gave up."""
    if conn.is_closed():
        return
    with contextlib.suppress(OSError):
        sock = _socket(conn)
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.terminate()


@dataclass(frozen=True, slots=True)
class Session:
    """A server session: a pid alone can be reused, a pid with its start time cannot."""

    pid: int
    backend_start: datetime


class Database:
    """A lazily (re)connected asyncpg connection with the writer's session settings.

    Nothing connects in the constructor; :meth:`get` connects on first use and after
    any loss. ``on_down`` is called with the Unix time the current run of failures began
    (on its first failure) and with None on the next success.
    """

    def __init__(
        self,
        dsn: str,
        *,
        idle_in_transaction_timeout_ms: int = 15_000,
        connect_timeout: float = 10.0,
        statement_timeout: float = 30.0,
        commit_timeout: float = 30.0,
        down_error_after: float = 60.0,
        application_name: str = "ackline",
        on_down: Callable[[float | None], None] | None = None,
    ) -> None:
        self._dsn = dsn
        self.bounds = Bounds(
            connect_s=connect_timeout,
            statement_s=statement_timeout,
            commit_s=commit_timeout,
            idle_in_transaction_ms=idle_in_transaction_timeout_ms,
            down_error_after_s=down_error_after,
        )
        self._settings = session_settings(self.bounds, application_name)
        self._conn: asyncpg.Connection | None = None
        self._session: Session | None = None
        self._orphan: Session | None = None  # a dropped session that may live on
        self._on_down = on_down
        self._down_since: float | None = None  # monotonic
        self._unreachable_since: float | None = None  # monotonic: connects failing since
        self._last_error_log = 0.0

    # -- the connection ------------------------------------------------------------

    async def get(self) -> asyncpg.Connection:
        """The connection, made when there is none; a dropped session is ended first.

        Order of effects on a (re)connect: connect (bounded); set the socket options;
        read this session's start time (bounded), the first answer the server gives
        this connection; end the dropped session, if any, and wait until it is gone
        (bounded). A failure at any step drops the new connection and keeps the old
        session on the list, so the next call tries again. PostgreSQL counts as reached
        (:attr:`unreachable_since`) once that first read answers: a connect, or a first
        read, that gets no answer leaves it unreached.
        """
        if self._conn is not None and not self._conn.is_closed():
            return self._conn
        self._conn = self._session = None
        began = time.monotonic()
        try:
            conn = await self._open()
            started = await self._first_answer(conn, began)
        except TransientDatabaseError:
            if self._unreachable_since is None:
                self._unreachable_since = time.monotonic()
            raise
        self._unreachable_since = None
        try:
            await self._end_orphan(conn)
        except BaseException:
            drop(conn)
            raise
        self._conn = conn
        self._session = Session(conn.get_server_pid(), started)
        return conn

    async def _first_answer(self, conn: asyncpg.Connection, began: float) -> datetime:
        """This session's start time, read on the new connection ``conn``, opened at
        ``began`` (dropped on any failure). It is part of connecting: bounded by what is
        left of ``connect_s`` (at least a second), and no answer in time, or the
        connection lost, is a failure to connect (:class:`TransientDatabaseError`): a
        connection pooler that logs clients in while its server is gone, or a link that
        goes dark after the handshake, accepts every connect and answers nothing. An
        error the server sends is its answer and propagates as it is."""
        left = max(1.0, self.bounds.connect_s - (time.monotonic() - began))
        try:
            started: datetime = await conn.fetchval(_BACKEND_START, timeout=left)
        except BaseException as exc:
            drop(conn)
            if isinstance(exc, (TimeoutError, OSError, asyncpg.InterfaceError)):
                raise TransientDatabaseError(
                    f"cannot connect to PostgreSQL: connected, then no answer: {describe(exc)}"
                ) from exc
            raise
        return started

    async def _open(self) -> asyncpg.Connection:
        """A new connection with this database's settings and bounds."""
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns the connection
            # and drops a cancellation that lands as the connect completes (a stop request
            # or a claim's deadline would be lost).
            async with asyncio.timeout(self.bounds.connect_s + 1.0):  # asyncpg's fires first
                conn = await asyncpg.connect(
                    self._dsn,
                    timeout=self.bounds.connect_s,
                    command_timeout=self.bounds.statement_s,
                    server_settings=self._settings,
                )
        except BaseException as exc:
            if isinstance(exc, Exception) and is_transient(exc):
                raise TransientDatabaseError(
                    f"cannot connect to PostgreSQL: {describe(exc)}"
                ) from exc
            raise
        try:
            bound_socket(conn, self.bounds)
        except BaseException:
            drop(conn)
            raise
        return conn

    async def connect_aside(self) -> asyncpg.Connection:
        """A second connection, to look at the server while this one waits (a claim
        watching what it waits for); the caller terminates it."""
        return await self._open()

    async def _end_orphan(self, conn: asyncpg.Connection) -> None:
        """Terminate the session dropped last, and wait until it is gone: until then it may
        hold row locks, and a COMMIT it received may still complete."""
        orphan = self._orphan
        if orphan is None:
            return
        try:
            row = await conn.fetchrow(
                _END_OLD_SESSION,
                orphan.pid,
                orphan.backend_start,
                self.bounds.terminate_wait_ms,
            )
        except asyncpg.InsufficientPrivilegeError as exc:
            # Another role's session (the DSN changed?): the server's own timeouts end it.
            log.warning("cannot end the dropped session (pid %d): %s", orphan.pid, exc)
            self._orphan = None
            return
        assert row is not None  # an aggregate always returns one row
        if not row["gone"]:
            raise TransientDatabaseError(f"the dropped session (pid {orphan.pid}) is still alive")
        if row["found"]:
            log.info("ended the dropped session (pid %d), which was still there", orphan.pid)
        self._orphan = None

    @property
    def session(self) -> Session | None:
        """The server session of the current connection (None when not connected)."""
        return self._session

    async def discard(self) -> None:
        """Drop the connection after an error, never waiting on the server; the next
        :meth:`get` reconnects and ends the dropped session first."""
        conn, self._conn = self._conn, None
        if self._session is not None:
            self._orphan = self._session
        self._session = None
        if conn is not None:
            drop(conn)

    async def close(self, timeout: float | None = None) -> None:
        """Close politely within ``timeout`` (default: the connect bound); terminate when
        that does not finish in time."""
        conn, self._conn = self._conn, None
        self._session = None
        if conn is not None and not conn.is_closed():
            bound = self.bounds.connect_s if timeout is None else timeout
            try:
                async with asyncio.timeout(bound):  # not wait_for: see _open
                    await conn.close()
            except Exception:
                drop(conn)

    # -- failures and retries ------------------------------------------------------

    @property
    def down_since(self) -> float | None:
        """Monotonic time of the first failure since the last success, or None."""
        return self._down_since

    @property
    def unreachable_since(self) -> float | None:
        """Monotonic time since which every connect has failed (None: the last one
        succeeded, or none failed); a connect succeeds once the new connection's first
        read answers (:meth:`get`). Unlike :attr:`down_since` it leaves out failures of a
        server that answers: a lock wait, a statement timeout, a full disk."""
        return self._unreachable_since

    def failed(self, what: str, exc: BaseException, retry_in: float, quiet: bool = False) -> None:
        """Count a transient failure of ``what`` and log it at the level its age calls for:
        WARNING while the outage is younger than ``down_error_after_s``, then ERROR (once,
        then once per ``down_error_after_s``; DEBUG in between). ``quiet``: counted, not
        logged (the caller says what is to be said)."""
        now = time.monotonic()
        if self._down_since is None:
            self._down_since = now
            self._last_error_log = 0.0
            if self._on_down is not None:
                self._on_down(time.time())
        if quiet:
            return
        age = now - self._down_since
        limit = self.bounds.down_error_after_s
        if age < limit:
            log.warning(
                "%s: transient PostgreSQL error, retrying in %.2fs: %s",
                what,
                retry_in,
                describe(exc),
            )
        elif now - self._last_error_log >= limit:
            self._last_error_log = now
            log.error(
                "%s: PostgreSQL has been failing for %.0fs (longer than "
                "ACKLINE_DB_DOWN_ERROR_AFTER_S=%g), still retrying: %s",
                what,
                age,
                limit,
                describe(exc),
            )
        else:
            log.debug("%s: still failing, retrying in %.2fs: %s", what, retry_in, describe(exc))

    def succeeded(self, quiet: bool = False) -> None:
        """End the current run of failures, if any (logged unless ``quiet``)."""
        if self._down_since is None:
            return
        age = time.monotonic() - self._down_since
        self._down_since = None
        if not quiet:
            log.info("PostgreSQL answers again after %.1fs of failures", age)
        if self._on_down is not None:
            self._on_down(None)

    async def retrying(
        self,
        what: str,
        operation: Callable[[asyncpg.Connection], Awaitable[T]],
        *,
        max_backoff: float = RETRY_MAX_BACKOFF_S,
        on_retry: Callable[[BaseException], None] | None = None,
        stopping: Callable[[], bool] | None = None,
        quiet: bool = False,
    ) -> T:
        """Run ``operation`` until it succeeds, reconnecting with jittered backoff.

        Only transient errors are retried; anything else propagates. Every attempt is
        bounded (connect and statement timeouts). ``stopping`` is polled every 0.1 s,
        during an attempt too: once it is true the attempt is cancelled, the connection
        dropped and :class:`WaitStoppedError` raised. Cancellation propagates at once.
        Failures are logged by :meth:`failed` (WARNING, then ERROR past
        ``down_error_after_s``) and then told to ``on_retry``; with ``quiet`` they are
        only told to ``on_retry``, which says what is to be said, and when (`ackline
        run`'s wait before it joins its group: a WARNING every 30 s).
        """
        delay = 0.05
        while True:
            self._check_stop(stopping, what)
            conn: asyncpg.Connection | None = None
            try:
                conn = await self._watch(self.get(), stopping, what)
                result = await self._watch(operation(conn), stopping, what)
            except (WaitStoppedError, asyncio.CancelledError):
                await self.discard()  # the attempt was cut short: its state is unknown
                raise
            except Exception as exc:
                if not isinstance(exc, TransientDatabaseError) and not is_transient(exc, conn):
                    raise
                pause = delay * (0.5 + random.random())
                self.failed(what, exc, pause, quiet)
                if on_retry is not None:
                    on_retry(exc)
                await self.discard()
                await self.pause(pause, stopping, what)
                delay = min(delay * 2, max_backoff)
            else:
                self.succeeded(quiet)
                return result

    async def answers(self) -> None:
        """``SELECT 1``, retried through outages: returns once PostgreSQL answers this
        connection again (its run of failures then ended)."""
        await self.retrying("probe", lambda conn: conn.fetchval("SELECT 1"))

    @staticmethod
    def _check_stop(stopping: Callable[[], bool] | None, what: str) -> None:
        if stopping is not None and stopping():
            raise WaitStoppedError(f"{what}: stopping; gave up waiting on PostgreSQL")

    async def _watch(self, aw: Awaitable[T], stopping: Callable[[], bool] | None, what: str) -> T:
        """Await ``aw``, cancelling it as soon as ``stopping()`` (checked every 0.1 s)."""
        if stopping is None:
            return await aw
        task = asyncio.ensure_future(aw)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=_STOP_POLL_S)
                if done:
                    return task.result()
                self._check_stop(stopping, what)
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    async def pause(
        self, seconds: float, stopping: Callable[[], bool] | None = None, what: str = "wait"
    ) -> None:
        """Sleep ``seconds``; raise :class:`WaitStoppedError` as soon as ``stopping()``."""
        if stopping is None:
            await asyncio.sleep(seconds)
            return
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self._check_stop(stopping, what)
            await asyncio.sleep(min(left, _STOP_POLL_S))
