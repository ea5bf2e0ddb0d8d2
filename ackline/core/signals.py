"""Signals that stop a command cleanly, for the length of a block."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from types import FrameType
from typing import Any, NoReturn, TypeVar

from ackline.core.errors import Terminated
from ackline.core.logs import exit_flushed

T = TypeVar("T")
F = TypeVar("F", bound="asyncio.Future[Any]")
log = logging.getLogger(__name__)

_raised: list[int] = []
"""The SIGTERMs :func:`terminate_as_exit`'s handler raised as :class:`Terminated` in the
innermost block now running (the outer block's record is back at its end)."""

_went_on: list[int] = []
"""The signals :func:`means_now` said the stop goes on after (once each)."""

_done: list[int] = []
"""The exit status of the command whose work is over (:func:`work_done`), if it is."""


def work_done(status: int) -> int:
    """Record that the running command's work is over and ``status`` is its exit status,
    and return it. A stop from here on does not change it: :func:`stops_deferred` does not
    raise one that comes after, and ``ackline.cli`` returns ``status`` if one does come
    through. A `dispatch --once` that had printed its summary ("stopped": null) exited 143
    when a SIGTERM landed while it wound down, so a cron job took a finished run for a cut
    one."""
    _done[:] = [status]
    return status


def done_status() -> int | None:
    """The status :func:`work_done` recorded, or None while the work goes on."""
    return _done[0] if _done else None


def begin_work() -> None:
    """A command starts: no work of it is over yet (a process may run several, in tests)."""
    _done.clear()
    _went_on.clear()


@contextlib.contextmanager
def terminate_as_exit() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` in the main thread while the block runs, so
    ``finally`` blocks and context managers clean up (partial files removed, producers
    closed, a stack the command started stopped) and the process exits 143. Python's own
    default would kill it with no cleanup at all. Commands that run an asyncio loop
    install their own handlers for the loop's lifetime (:func:`stop_signals`).

    The handler raises wherever the main thread is, and some library code drops what is
    raised there: asyncpg's protocol methods end in ``finally: return await waiter``, so a
    SIGTERM handled inside one of its writes was lost, and since the handler ignores the
    SIGTERMs after the first, the command ran on, deaf. So the raise is also recorded:
    :func:`stop_signals` stops a loop started after a lost one at once, polling loops
    raise it again (:func:`raise_if_stop_lost`), and :func:`stops_deferred` keeps the
    raise out of a loop's library code in the first place. Python drops a raise in a
    weakref callback or a ``__del__`` too, and prints its traceback: the block prints
    none for a :class:`Terminated`, which is recorded like any other lost one."""

    def handler(signum: int, frame: FrameType | None) -> None:
        # once: a second SIGTERM must not cut the cleanup the first one started
        ignore_sigterm()
        _raised.append(signum)
        raise Terminated()

    handler.raises_terminated = True  # type: ignore[attr-defined]
    outer = _raised[:]  # a block inside another keeps the other's record
    _raised.clear()
    report = sys.unraisablehook

    def unreported(unraisable: sys.UnraisableHookArgs) -> None:
        # a SIGTERM raised in a weakref callback or a __del__ is dropped there and Python
        # prints its traceback; the drop is recorded already (stop_lost), so print nothing
        if unraisable.exc_type is not Terminated:
            report(unraisable)

    previous = signal.signal(signal.SIGTERM, handler)
    sys.unraisablehook = unreported
    try:
        yield
    finally:
        sys.unraisablehook = report
        # None: a handler not set from Python, which cannot be put back from here
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
        _raised[:] = outer


def _handling_terminated() -> bool:
    """True while a :class:`Terminated` is being handled or is on its way out (an
    ``except`` or ``finally`` block it reached, and every call made from there)."""
    exc: BaseException | None = sys.exc_info()[1]
    while exc is not None:
        if isinstance(exc, Terminated):
            return True
        exc = exc.__context__
    return False


def stop_lost() -> bool:
    """True when :func:`terminate_as_exit`'s handler raised and nothing handles that
    :class:`Terminated` now: library code dropped it, and the command runs on (or code
    caught it on purpose and went on, which nothing in ackline does). Main thread only:
    what is being handled is per thread."""
    return bool(_raised) and not _handling_terminated()


def raise_if_stop_lost() -> None:
    """Raise :class:`Terminated` again when the one SIGTERM raised was lost (see
    :func:`terminate_as_exit`): for the polling loops of a command's work. From its
    cleanup it does nothing, since the first one is handled there."""
    if stop_lost():
        raise Terminated()


def _raises(handler: object) -> bool:
    """A Python-level handler that raises in the main thread: this module's SIGTERM
    handler, or Python's default for SIGINT (KeyboardInterrupt)."""
    return handler is signal.default_int_handler or bool(
        getattr(handler, "raises_terminated", False)
    )


@contextlib.contextmanager
def stops_deferred(loop: asyncio.AbstractEventLoop, cancel: Callable[[], object]) -> Iterator[None]:
    """While ``loop`` runs in the block, a SIGTERM or SIGINT whose handler would raise is
    recorded instead, cancels the block's call once (``cancel``, from the loop: a second
    signal must not cut the cleanup the first began) and is raised again when the block
    ends, however it ends, outside the library code the loop ran (asyncpg drops an
    exception raised inside its writes: see :func:`terminate_as_exit`). The record is a
    Python handler that never raises, so a signal in the loop's last turn, whose loop
    callback never runs, is raised too. Signals whose handler does not raise (ignored in
    a teardown) are left alone, and so is a thread other than the main one. A SIGTERM the
    block's own code set to be ignored (:func:`ignore_sigterm`: a command that took the
    signals over and is winding down) stays ignored after it; a stop recorded before that
    is raised all the same. A SIGTERM dropped before the block (see
    :func:`terminate_as_exit`) is raised at its start, before the loop runs: its handler
    ignores SIGTERM from then on, so the block would not see one."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _raise_if_dropped()
    stops = [sig for sig in (signal.SIGTERM, signal.SIGINT) if _raises(signal.getsignal(sig))]
    before = {sig: signal.getsignal(sig) for sig in stops}
    came: list[int] = []
    cancelled: list[bool] = []

    def record(signum: int, frame: FrameType | None) -> None:
        came.append(signum)

    def wake(sig: int) -> None:
        if not cancelled:
            cancelled.append(True)
            cancel()

    for sig in stops:
        loop.add_signal_handler(sig, wake, sig)  # the loop's wakeup, and the cancel
        signal.signal(sig, record)  # in place of asyncio's do-nothing Python handler
    try:
        yield
    except asyncio.CancelledError:
        if not came:
            raise
    finally:
        for sig in stops:
            ignored = signal.getsignal(sig) is _ignored  # read first: the removal resets it
            loop.remove_signal_handler(sig)
            # a teardown begun inside keeps it ignored
            signal.signal(sig, _ignored if ignored else before[sig])
        if came and not _done:  # the stop, now that the loop is not running, as if it came
            _raise_again(came[0])  # just now; after the work was over it changes nothing


class StopCheck:
    """What :func:`stops_between` yields: call it to raise a recorded stop; ``pending``
    says whether one is recorded, for code that polls a ``stopping`` predicate (an inner
    block leaves the signals to the outer one, so only the outer record sees them)."""

    def __init__(self, came: list[int], raise_it: Callable[[], None]) -> None:
        self._came = came
        self._raise_it = raise_it

    def __call__(self) -> None:
        self._raise_it()

    def pending(self) -> bool:
        return bool(self._came)


@contextlib.contextmanager
def stops_between() -> Iterator[StopCheck]:
    """While the block makes short blocking library calls from the main thread, a SIGTERM
    or SIGINT whose handler would raise is recorded instead; the block calls the yielded
    ``check`` between them, which raises it (as its handler would), and so does the end
    of the block. Raised inside such a call it was lost: librdkafka runs Python log
    callbacks within its calls and drops what they raise, so a stop at start-up went
    unseen and the command failed 10 s later as if Kafka were down (exit 2). A SIGTERM
    dropped before the block is raised at its start, as :func:`stops_deferred` does."""
    came: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield StopCheck(came, lambda: None)
        return
    _raise_if_dropped()
    stops = [sig for sig in (signal.SIGTERM, signal.SIGINT) if _raises(signal.getsignal(sig))]
    before = {sig: signal.getsignal(sig) for sig in stops}

    def record(signum: int, frame: FrameType | None) -> None:
        came.append(signum)

    def restore() -> None:
        for sig in stops:
            if signal.getsignal(sig) is record:
                signal.signal(sig, before[sig])

    def check() -> None:
        if came:
            sig = came[0]
            came.clear()  # raised once: the finally's check must not raise it again
            restore()
            _raise_again(sig)

    try:
        for sig in stops:
            signal.signal(sig, record)
        yield StopCheck(came, check)
    finally:
        restore()
        check()  # also when the block raised: the stop is the news


def _raise_if_dropped() -> None:
    """Raise :class:`Terminated` when a SIGTERM was dropped (:func:`stop_lost`) while the
    work goes on: Python drops one raised in a ``__del__`` or a weakref callback, and
    prints nothing for it, so a `verify` or `migrate` ran to its end, deaf and silent.
    After the work is over it changes nothing (:func:`work_done`)."""
    if stop_lost() and not _done:
        raise Terminated()


def _raise_again(sig: int) -> NoReturn:
    """A stop that was recorded, raised by its own handler (now back) as if it came just
    now; and raised here if that handler did not raise (the block's own code took the
    signals over and set SIGTERM to be ignored after the stop had come, a command
    winding down): the stop still ends it."""
    signal.raise_signal(sig)
    raise KeyboardInterrupt() if sig == signal.SIGINT else Terminated()


def run_deferring_stops(loop: asyncio.AbstractEventLoop, aw: Awaitable[T]) -> T:
    """``loop.run_until_complete(aw)`` under :func:`stops_deferred`: a stop meanwhile
    cancels ``aw`` and is raised once the loop has returned."""
    task = asyncio.ensure_future(aw, loop=loop)
    with stops_deferred(loop, task.cancel):
        return loop.run_until_complete(task)
    raise AssertionError("unreachable: stops_deferred raises a stop it swallowed")


def run_stoppable(aw: Awaitable[T]) -> T:
    """``asyncio.run(aw)`` under :func:`stops_deferred`: for a command's short async steps
    while :func:`terminate_as_exit`'s handler is in place. Unlike ``asyncio.run``, a
    second Ctrl-C does not interrupt a call that ignores its cancellation."""
    with asyncio.Runner() as runner:
        return run_deferring_stops(runner.get_loop(), aw)


def stopped_status(sig: int) -> int:
    """The exit status of a command a stop cut short: 128 + the signal (130 Ctrl-C, 143
    SIGTERM), as a shell reports a process the signal ended. For a run that would have
    ended by itself (`dispatch --once`): 0 would say it had finished."""
    return 128 + sig


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
    on_repeat: Callable[[int], None] | None = None,
) -> Iterator[None]:
    """SIGTERM and SIGINT request a clean stop while the block runs (``on_signal`` is told
    which came); a later one calls ``on_repeat`` instead, when given (an operator who
    signals again means now). After the block, the handlers that were there before are
    back. The loop's ``remove_signal_handler`` leaves the default action behind (SIGTERM
    kills at once), so a command that goes on after the worker (``ackline demo``
    verifies, then stops its stack) would have been killed mid-cleanup by a later
    SIGTERM."""
    stops = (signal.SIGTERM, signal.SIGINT)
    before = {sig: signal.getsignal(sig) for sig in stops}
    seen = False

    def stop(sig: int) -> None:
        nonlocal seen
        if seen and on_repeat is not None:
            on_repeat(sig)
            return
        seen = True
        if on_signal is not None:
            on_signal(sig)
        request_stop()

    for sig in stops:
        loop.add_signal_handler(sig, stop, sig)
    if stop_lost():  # a SIGTERM that came before these handlers was dropped: stop now
        loop.call_soon(stop, signal.SIGTERM)
    try:
        yield
    finally:
        for sig in stops:
            _put_back(loop, sig, before[sig])


def _put_back(
    loop: asyncio.AbstractEventLoop, sig: int, previous: Callable[..., object] | int | None
) -> None:
    """Take ``sig`` from ``loop`` and put ``previous`` back, never through the default
    action: the loop's ``remove_signal_handler`` sets it (SIGTERM kills) before the
    previous handler is back, and a SIGTERM then killed a command whose summary was out
    (-15: 143 to a shell). So the previous handler replaces the loop's in one step, and
    the loop forgets its own (its table is CPython's, stable since 3.4). Blocking the
    signal meanwhile is not enough: the mask is the calling thread's, and a process
    with another thread (an executor's: a host name resolved, ``asyncio.to_thread``)
    takes the signal there, default action and all. The masked removal stays for a
    loop without that table, or nothing to put back (``previous`` None: not set from
    Python)."""
    handlers = getattr(loop, "_signal_handlers", None)
    if previous is not None and isinstance(handlers, dict) and sig in handlers:
        signal.signal(sig, previous)
        del handlers[sig]
        if not handlers:
            with contextlib.suppress(ValueError, OSError):
                signal.set_wakeup_fd(-1)  # as the loop's removal does when none are left
        return
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())  # unchanged: restored whatever comes
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, {sig})  # may run a pending handler, which
        loop.remove_signal_handler(sig)  # may raise: the mask is restored all the same
        if previous is not None:
            signal.signal(sig, previous)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def means_now(sig: int) -> bool:
    """Whether a stop signal that comes while a stop is under way means "now": SIGINT again
    (Ctrl-C twice: someone at a terminal) does. A SIGTERM, which supervisors and scripts
    may send more than once (docs/design.md), does not: the bounded stop goes on, and the
    log says so. The one rule of every command that stops (:func:`exit_now`,
    :class:`Stopping`); what "now" does is theirs."""
    if sig == signal.SIGINT:
        return True
    if sig not in _went_on:  # a supervisor may repeat it every few ms: said once
        _went_on.append(sig)
        log.info("%s while stopping: the stop goes on", signal.Signals(sig).name)
    return False


def exit_now(sig: int) -> None:
    """A signal during a worker's stop (either runtime): when it :func:`means_now`, exit
    at once, status 130. Safe at any point: PostgreSQL decides what committed (a
    transaction cut before its COMMIT rolls back, and its records are re-read from the DB
    offsets); Kafka's offsets are only advisory."""
    if not means_now(sig):
        return
    log.warning(
        "SIGINT while stopping: exiting now; what committed in PostgreSQL stands, "
        "the batches in flight are re-read by the next owner"
    )
    exit_flushed(128 + sig)


class Stopping:
    """A stop with a bound, for work that runs in tasks of one loop (`tail`, `dispatch`,
    `process`): once ``stop`` is set (:meth:`request`, or the caller's own ``stop.set()``
    followed by :meth:`arm`), the work has ``wait_s`` to finish the batch in hand; the
    tasks still running then are cancelled (a read blocked on a lock or a stalled server
    must not outlive the grace period of a container; a cancelled batch rolls back, and
    is read again). A second stop signal that :func:`means_now` (Ctrl-C twice) cancels
    them at once: an operator's second Ctrl-C waited out the whole grace period (30 s).
    Signals reach it through :func:`bounded_stop`."""

    def __init__(self, stop: asyncio.Event, wait_s: float) -> None:
        self.stop = stop
        self.wait_s = wait_s
        self.signal: int | None = None  # the stop request's signal, once one came
        self.cancelled = False  # work of :meth:`run` or :meth:`watch` was cut
        self._tasks: list[asyncio.Future[Any]] = []
        self._timer: asyncio.TimerHandle | None = None

    def request(self, sig: int) -> None:
        """The first stop signal: remembered, ``stop`` set, the grace period begun."""
        self.signal = sig
        self.stop.set()
        self.arm()

    def again(self, sig: int) -> None:
        """A later stop signal: cancel the work at once when it :func:`means_now`."""
        if means_now(sig):
            name = signal.Signals(sig).name
            # "a second" only when it is: a SIGINT after a SIGTERM is the first SIGINT
            self._cancel(f"a second {name}" if sig == self.signal else f"{name} while stopping")

    def arm(self) -> None:
        """Begin the grace period, once: from the stop request, or from when the caller
        saw ``stop`` set by other means (a test, a caller without signals)."""
        if self._timer is None:
            why = f"shutdown wait ({self.wait_s:.0f}s) ran out"
            self._timer = asyncio.get_running_loop().call_later(self.wait_s, self._cancel, why)

    def watch(self, task: F) -> F:
        """``task``, to be cancelled when the grace period runs out or a stop means now."""
        self._tasks.append(task)
        return task

    def _cancel(self, why: str) -> None:
        late = [t for t in self._tasks if not t.done()]
        if late:
            self.cancelled = True
            log.warning("%s: cancelling", why)
            for task in late:
                task.cancel()

    async def run(self, work: Awaitable[T]) -> T | None:
        """``work`` until it returns; None when it was cancelled after a stop request."""
        task = self.watch(asyncio.ensure_future(work))
        try:
            return await task
        except asyncio.CancelledError:
            if not self.cancelled:
                raise
            return None


@contextlib.contextmanager
def bounded_stop(stop: asyncio.Event, wait_s: float) -> Iterator[Stopping]:
    """SIGTERM and SIGINT stop the block's work by a :class:`Stopping` (installed by
    :func:`stop_signals`: the handlers that were there before are back after the block,
    so a signal while the command winds down is theirs, and does not cut the cleanup)."""
    stopping = Stopping(stop, wait_s)
    with stop_signals(
        asyncio.get_running_loop(), stop.set, on_signal=stopping.request, on_repeat=stopping.again
    ):
        yield stopping
