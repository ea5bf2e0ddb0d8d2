"""A stop recorded around librdkafka's calls is raised once, and a connect failure keeps
its own words (a review of this stop's changes)."""

from __future__ import annotations

import signal
import socket
import ssl
import sys

import pytest

from ackline.commands.guard import reason
from ackline.core.errors import Terminated
from ackline.core.signals import stop_lost, stops_between, terminate_as_exit


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
