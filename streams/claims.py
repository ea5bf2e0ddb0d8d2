"""The consumer thread's calls to PostgreSQL: claims of partitions.

They run on the worker's event loop (which owns PostgreSQL), retried through outages by
the control connection, one at a time (the control connection is one asyncpg connection),
and the waiting ones give up at a stop request: a worker waiting on an unreachable
database inside its assign callback must still honour SIGTERM. A claim started without
waiting (:meth:`Claims.claim_later`) is the caller's to cancel.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence

from ackline.sinks.connection import Database
from ackline.sinks.ingest.batch import TP
from ackline.sinks.ingest.offsets import Claim, claim_over
from ackline.streams.errors import StoppingError
from ackline.streams.inflight import call_on_loop

log = logging.getLogger(__name__)


class Claims:
    """Claim partitions for one worker, from another thread."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        control_db: Database,
        group_id: str,
        worker_id: str,
        stopping: Callable[[], bool],
    ) -> None:
        self._loop = loop
        self._db = control_db
        self._group = group_id
        self._worker = worker_id
        self._stopping = stopping
        # One control connection (a Database holds one, unlocked): a claim started by
        # claim_later may still be retrying when a callback claims.
        self._lock = asyncio.Lock()

    async def _claim(self, tps: list[TP], starts: Mapping[TP, int] | None) -> list[Claim]:
        async with self._lock:
            return await claim_over(self._db, self._group, self._worker, tps, starts)

    def claim(
        self,
        tps: list[TP],
        starts: Mapping[TP, int] | None = None,
        give_up: Callable[[], bool] = lambda: False,
    ) -> list[Claim] | None:
        """Claim ``tps`` (:func:`ackline.sinks.ingest.offsets.claim_over`: one autocommitted
        statement bumping the epochs, storing ``starts`` where no offset is stored; a previous
        owner stuck on its client with their rows locked is ended);
        None when stopping or once ``give_up()`` (polled while the claim retries), and then
        nothing was claimed or the claim is abandoned (a claim that lands anyway leaves only
        higher epochs: the next claim bumps them)."""
        try:
            return call_on_loop(
                self._loop, self._claim(tps, starts), lambda: self._stopping() or give_up()
            )
        except StoppingError:
            why = "stopping" if self._stopping() else "PostgreSQL away"
            log.warning("%s while claiming %s: not assigning them", why, [p for _, p in tps])
            return None

    def claim_later(self, tps: list[TP]) -> concurrent.futures.Future[list[Claim]]:
        """:meth:`claim` without waiting: the claim runs on the loop (retried through
        outages) while the calling thread goes on polling Kafka, which a rebalance may
        need it to do. Cancel the future to abandon it (as :meth:`claim` does at a stop)."""
        return asyncio.run_coroutine_threadsafe(self._claim(tps, None), self._loop)

    def probe_later(
        self, also: Sequence[Callable[[], Awaitable[None]]] = ()
    ) -> concurrent.futures.Future[None]:
        """``SELECT 1`` on the control connection, and each of ``also`` (the writers'
        probes), retried through outages, started without waiting: done once PostgreSQL
        answers every one of them, so a worker that joins again can claim and write.
        Cancel the future to abandon it."""
        return asyncio.run_coroutine_threadsafe(self._probe(also), self._loop)

    async def _probe(self, also: Sequence[Callable[[], Awaitable[None]]]) -> None:
        async def control() -> None:
            async with self._lock:
                await self._db.answers()

        await asyncio.gather(control(), *(probe() for probe in also))
