"""Signals that stop a command cleanly, for the length of a block."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator
from types import FrameType

from ackline.core.errors import Terminated


@contextlib.contextmanager
def terminate_as_exit() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` in the main thread while the block runs, so
    ``finally`` blocks and context managers clean up (partial files removed, producers
    closed, a stack the command started stopped) and the process exits 143. Python's own
    default would kill it with no cleanup at all. Commands that run an asyncio loop
    install their own handlers for the loop's lifetime (:func:`stop_signals`)."""

    def handler(signum: int, frame: FrameType | None) -> None:
        # once: a second SIGTERM must not cut the cleanup the first one started
        ignore_sigterm()
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        # None: a handler not set from Python, which cannot be put back from here
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def ignore_sigterm() -> None:
    """SIGTERM is ignored until the :func:`terminate_as_exit` block around this ends: for
    the ``finally`` that stops a stack, which a SIGTERM must not cut (the first one raised
    :class:`Terminated` into it already).

    By a handler that does nothing, not SIG_IGN: a child inherits an ignored signal across
    exec, so every process the teardown started (a ``pg_ctl stop``, a broker's stop) was
    deaf to SIGTERM for good; a handler is reset to the default in the child."""
    signal.signal(signal.SIGTERM, _ignored)


def _ignored(signum: int, frame: FrameType | None) -> None:
    """SIGTERM's handler while a teardown runs: nothing (see :func:`ignore_sigterm`)."""


@contextlib.contextmanager
def stop_signals(
    loop: asyncio.AbstractEventLoop,
    request_stop: Callable[[], None],
    on_signal: Callable[[int], None] | None = None,
) -> Iterator[None]:
    """SIGTERM and SIGINT request a clean stop while the block runs (``on_signal`` is told
    which came); after it, the handlers that were there before are back. The loop's
    ``remove_signal_handler`` leaves the default action behind (SIGTERM kills at once), so
    a command that goes on after the worker (``ackline demo`` verifies, then stops its
    stack) would have been killed mid-cleanup by a later SIGTERM."""
    stops = (signal.SIGTERM, signal.SIGINT)
    before = {sig: signal.getsignal(sig) for sig in stops}

    def stop(sig: int) -> None:
        if on_signal is not None:
            on_signal(sig)
        request_stop()

    for sig in stops:
        loop.add_signal_handler(sig, stop, sig)
    try:
        yield
    finally:
        for sig in stops:
            loop.remove_signal_handler(sig)
            previous = before[sig]
            if previous is not None:  # None: not set from Python; nothing to restore
                signal.signal(sig, previous)
