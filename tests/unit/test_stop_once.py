"""A stop recorded around librdkafka's calls is raised once, and a connect failure keeps
its own words (a review of this stop's changes)."""

from __future__ import annotations

import logging
import signal
import socket
import ssl
import subprocess
import sys

import pytest

from ackline.commands.guard import reason
from ackline.core.errors import Terminated
from ackline.core.signals import (
    begin_work,
    means_now,
    run_stoppable,
    stop_lost,
    stops_between,
    terminate_as_exit,
)


def test_a_recorded_stop_is_raised_once() -> None:
    """check() raised it between two calls, then the block's end raised it again, over
    the first: the stop chained onto itself."""
    with terminate_as_exit(), pytest.raises(Terminated) as caught, stops_between() as check:
        signal.raise_signal(signal.SIGTERM)  # recorded, not raised here
        try:
            raise ValueError("a read that failed")
        except ValueError:
            check()
    assert not isinstance(caught.value.__context__, Terminated), caught.value.__context__


def test_a_name_lookup_and_a_tls_failure_keep_their_words() -> None:
    """os.strerror(-2) is 'unknown error -2', and errno 1 of a TLS failure is 'operation
    not permitted': both hid what happened."""
    assert "Name or service not known" in reason(socket.gaierror(-2, "Name or service not known"))
    failed = ssl.SSLCertVerificationError(1, "certificate verify failed: self-signed")
    assert "certificate verify failed" in reason(failed)
    assert reason(ConnectionRefusedError(111, "refused")) == "connection refused"


def test_a_sigterm_raised_where_python_drops_it_prints_no_traceback() -> None:
    """A SIGTERM that landed in a weakref callback while `process` wound down after its
    summary printed "Exception ignored in ... Traceback ... Terminated: 143" on stderr
    (CI, stop 55): Python reports what a callback or ``__del__`` raises and drops it. The
    drop is recorded (the stop is lost, so a polling loop raises it again) and nothing is
    printed; what else such code raises is reported as before."""
    reported: list[type[BaseException] | None] = []
    before = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: reported.append(unraisable.exc_type)

    class SignalledOnCollect:
        def __del__(self) -> None:
            signal.raise_signal(signal.SIGTERM)

    class FailsOnCollect:
        def __del__(self) -> None:
            raise ValueError("a finalizer's own failure")

    try:
        with terminate_as_exit():
            dropped = SignalledOnCollect()
            del dropped
            assert stop_lost()
            failing = FailsOnCollect()
            del failing
    finally:
        sys.unraisablehook = before
    assert reported == [ValueError], reported


def test_sigterms_while_stopping_say_the_stop_goes_on_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A supervisor that repeats SIGTERM every few milliseconds while a stop runs wrote one
    INFO line per signal (a review's signal storm: hundreds of lines); once says it."""
    begin_work()
    with caplog.at_level(logging.INFO, logger="ackline.core.signals"):
        assert [means_now(signal.SIGTERM) for _ in range(50)] == [False] * 50
        assert means_now(signal.SIGINT)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["SIGTERM while stopping: the stop goes on"], lines


def test_a_sigint_after_a_sigterm_is_not_called_a_second_one() -> None:
    """The worker's stop began with a SIGTERM and a Ctrl-C ends it at once: the line said
    "SIGINT again", though no SIGINT came before."""
    code = (
        "import logging, signal, sys\n"
        "logging.basicConfig(stream=sys.stderr, level=logging.INFO)\n"
        "from ackline.core.signals import exit_now\n"
        "exit_now(signal.SIGINT)\n"
    )
    argv = [sys.executable, "-c", code]
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 130, done.stderr
    assert "SIGINT while stopping: exiting now" in done.stderr, done.stderr
    assert "again" not in done.stderr, done.stderr


def test_a_sigterm_python_dropped_stops_the_next_step() -> None:
    """A SIGTERM that landed in a ``__del__`` is dropped and, since its block prints
    nothing for it, was seen nowhere: the handler ignores every SIGTERM after it, and
    the short async steps (`verify`, `migrate`) and a block of library calls that came
    after ran to their end, exit 0. The next such step raises it."""

    class SignalledOnCollect:
        def __del__(self) -> None:
            signal.raise_signal(signal.SIGTERM)

    ran: list[str] = []

    async def step() -> None:
        ran.append("step")

    begin_work()
    with terminate_as_exit():
        dropped = SignalledOnCollect()
        del dropped
        with pytest.raises(Terminated):
            run_stoppable(step())
        with pytest.raises(Terminated), stops_between():
            ran.append("calls")
    assert ran == [], ran
