"""Signals that stop an asyncio service cleanly, for the length of a block."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator


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
