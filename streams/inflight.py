"""A batch write running on the event loop, watched from the consumer thread; and waiting
on the loop from that thread without ever becoming deaf to a stop request."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ackline.sinks.ingest.writer import WriteResult
from ackline.streams.errors import StoppingError

T = TypeVar("T")

POLL_S = 0.2
"""How often a thread waiting on the loop looks at the stop flag."""


class InFlight:
    """A batch write running as a task on the event loop.

    Unlike the future of ``run_coroutine_threadsafe``, which is done the moment it is
    cancelled, this is done only when the task has really ended, cancelled or not: so a
    cancelled write can be waited for, and never overlaps what comes after it.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        coro: Coroutine[Any, Any, WriteResult],
        any_ended: threading.Event | None = None,
    ) -> None:
        """``any_ended`` (shared by several writes) is set too when this one ends, so a
        thread can wait for whichever of its writes ends first."""
        self._loop = loop
        self._ended = threading.Event()
        self._any = any_ended
        self._task: asyncio.Task[WriteResult] | None = None
        loop.call_soon_threadsafe(self._start, coro)  # callbacks run in order: before cancel

    def _start(self, coro: Coroutine[Any, Any, WriteResult]) -> None:
        self._task = self._loop.create_task(coro)
        self._task.add_done_callback(self._on_end)

    def _on_end(self, _: object) -> None:
        self._ended.set()
        if self._any is not None:
            self._any.set()

    def done(self) -> bool:
        return self._ended.is_set()

    def wait(self, timeout: float) -> bool:
        return self._ended.wait(timeout)

    def cancel(self) -> None:
        self._loop.call_soon_threadsafe(self._cancel)

    def _cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def outcome(self) -> WriteResult:
        """The result, or the exception (CancelledError included); only once done."""
        if self._task is None or not self._ended.is_set():
            raise RuntimeError("the batch write has not ended")
        return self._task.result()


def call_on_loop(
    loop: asyncio.AbstractEventLoop,
    coro: Coroutine[Any, Any, T],
    stopping: Callable[[], bool],
) -> T:
    """Run ``coro`` on ``loop`` and wait for it from this (another) thread.

    Raises :class:`StoppingError` as soon as ``stopping()`` is true (the coroutine is
    cancelled then), so a thread waiting on PostgreSQL through a long outage still
    honours SIGTERM: the claim and re-read retries of the consumer thread wait here.
    """
    future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(coro, loop)
    while True:
        try:
            return future.result(timeout=POLL_S)
        except concurrent.futures.TimeoutError:
            if stopping():
                future.cancel()
                raise StoppingError("stopping: gave up waiting on PostgreSQL") from None
