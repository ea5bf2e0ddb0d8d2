"""One PostgreSQL connection that reconnects, and the rule for what is transient."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg

from ackline.sinks.errors import TransientDatabaseError

log = logging.getLogger(__name__)
T = TypeVar("T")

_TRANSIENT: tuple[type[BaseException], ...] = (
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,  # admin shutdown, crash, cannot connect now
    asyncpg.exceptions.TransactionRollbackError,  # serialization failure, deadlock
    asyncpg.exceptions.InsufficientResourcesError,  # too many connections, disk full
    asyncpg.exceptions.ConnectionDoesNotExistError,
    asyncpg.exceptions.InternalClientError,
    OSError,
    TimeoutError,
)


def is_transient(exc: BaseException, conn: asyncpg.Connection | None = None) -> bool:
    """True when retrying (on a fresh connection if need be) may succeed."""
    if isinstance(exc, _TRANSIENT):
        return True
    return isinstance(exc, asyncpg.InterfaceError) and (conn is None or conn.is_closed())


class Database:
    """A lazily (re)connected asyncpg connection with the writer's session settings.

    Nothing connects in the constructor; :meth:`get` connects on first use and after
    any loss.
    """

    def __init__(
        self,
        dsn: str,
        *,
        idle_in_transaction_timeout_ms: int = 15_000,
        connect_timeout: float = 10.0,
        application_name: str = "ackline",
    ) -> None:
        self._dsn = dsn
        self._conn: asyncpg.Connection | None = None
        self._settings = {
            # A stalled or stopped worker must not hold offset-row locks forever.
            "idle_in_transaction_session_timeout": str(idle_in_transaction_timeout_ms),
            "application_name": application_name,
        }
        self._connect_timeout = connect_timeout

    async def get(self) -> asyncpg.Connection:
        if self._conn is None or self._conn.is_closed():
            try:
                conn = await asyncpg.connect(
                    self._dsn, timeout=self._connect_timeout, server_settings=self._settings
                )
            except BaseException as exc:
                if isinstance(exc, Exception) and is_transient(exc):
                    raise TransientDatabaseError(f"cannot connect to PostgreSQL: {exc}") from exc
                raise
            self._conn = conn
        return self._conn

    async def discard(self) -> None:
        """Drop the connection after an error; the next :meth:`get` reconnects."""
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            conn.terminate()

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            try:
                await asyncio.wait_for(conn.close(), timeout=5)
            except Exception:
                conn.terminate()

    async def retrying(
        self,
        what: str,
        operation: Callable[[asyncpg.Connection], Awaitable[T]],
        *,
        max_backoff: float = 5.0,
        on_retry: Callable[[BaseException], None] | None = None,
    ) -> T:
        """Run ``operation`` until it succeeds, reconnecting with jittered backoff.

        Only transient errors are retried; anything else propagates. Cancellation
        propagates at once.
        """
        delay = 0.05
        while True:
            conn: asyncpg.Connection | None = None
            try:
                conn = await self.get()
                return await operation(conn)
            except Exception as exc:
                if not isinstance(exc, TransientDatabaseError) and not is_transient(exc, conn):
                    raise
                log.warning(
                    "%s: transient PostgreSQL error, retrying in %.2fs: %s", what, delay, exc
                )
                if on_retry is not None:
                    on_retry(exc)
                await self.discard()
                await asyncio.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, max_backoff)
