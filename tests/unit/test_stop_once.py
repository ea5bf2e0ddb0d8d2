"""A stop recorded around librdkafka's calls is raised once, and a connect failure keeps
its own words (a review of this stop's changes)."""

from __future__ import annotations

import signal
import socket
import ssl

import pytest

from ackline.commands.guard import reason
from ackline.core.errors import Terminated
from ackline.core.signals import stops_between, terminate_as_exit


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
