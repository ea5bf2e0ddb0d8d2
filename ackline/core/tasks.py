"""Tasks abandoned on purpose: their outcome is taken so asyncio logs nothing of it; and
work in a daemon thread, which a stop may abandon."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def take_outcome(task: asyncio.Future[Any]) -> None:
    """A done callback for a task that is cancelled or left behind on purpose (a cut
    call, a claim given up): retrieve its exception, if any, so that asyncio does not log
    "Task exception was never retrieved" about news nobody waits for."""
    if not task.cancelled():
        task.exception()


def in_daemon_thread(
    work: Callable[[], T], name: str
) -> tuple[asyncio.Future[T], threading.Thread]:
    """``work()`` in a new daemon thread, its outcome on a future of the running loop.

    Daemon, and not an executor's: an executor's threads are joined at the interpreter's
    exit, so a call left behind at a stop (a topic creation waits up to a minute, a
    DescribeTopics its bound) held the exit. A caller that stops waiting abandons it:
    the future is then settled by nobody or read by :func:`take_outcome`."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def body() -> None:
        try:
            value = work()
        except BaseException as exc:
            outcome: tuple[T | None, BaseException | None] = (None, exc)
        else:
            outcome = (value, None)
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(settle, future, *outcome)

    future.add_done_callback(take_outcome)  # read, if abandoned
    thread = threading.Thread(target=body, name=name, daemon=True)
    thread.start()
    return future, thread


def settle(future: asyncio.Future[T], value: T | None, exc: BaseException | None) -> None:
    """Settle ``future`` from a thread's outcome (on the loop), unless it already is."""
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(value)  # type: ignore[arg-type]
